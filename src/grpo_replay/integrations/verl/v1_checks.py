"""What the v1 replay trainer checks before anything starts, and the replay settings it runs with.

Three layers, each a ValueError naming the field and the allowed values:
- `check_config` (the config alone): the entry point before Ray, the task runner before TransferQueue starts and
  the trainer's `__init__` all run it, so a programmatic launch gets the same refusals;
- `check_paths` (the entry point, before Ray): local model and data paths exist;
- `check_resources` (the entry point for a Ray cluster it starts itself; the task runner, inside the cluster, for
  any cluster): TransferQueue's placement group (one CPU per storage unit plus its controller) fits, since
  `tq.init` otherwise waits for it forever without a message.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Any, NamedTuple, Optional

from omegaconf import OmegaConf

from ...config import ReplayConfig
from ...session import effective_age_bound
from .estimators import check_estimator
from .settings import VerlReplaySettings, resolve_replay

logger = logging.getLogger(__name__)

ASYNC_MODES = ("colocate_async", "separate_async")


def _get(config: Any, dotted: str, default: Any = None) -> Any:
    """`config.<dotted>` or `default` when a node on the way is absent (partial configs in programmatic use)."""
    if OmegaConf.is_config(config):
        return OmegaConf.select(config, dotted, default=default)
    node = config
    for part in dotted.split("."):
        node = node.get(part, None) if hasattr(node, "get") else None
        if node is None:
            return default
    return node


def off_policy_bound(config: Any) -> Optional[int]:
    """The largest replay age (in versions) verl's `trainer.v1.sampler.max_off_policy_threshold` allows, or None.

    verl counts a trajectory's span as the versions from its dispatch to its update, inclusive
    (`global_steps - dispatch_step + 1 <= threshold`), and enforces it in the async modes only (its sync sampler is
    on-policy; the threshold is a no-op there). A replay row of age a (trained policy a versions past the one
    that generated it) spans a + 1 versions, so the bound is threshold - 1."""
    if config.trainer.v1.trainer_mode not in ASYNC_MODES:
        return None
    threshold = _get(config, "trainer.v1.sampler.max_off_policy_threshold")
    return None if threshold is None else int(threshold) - 1


class V1Replay(NamedTuple):
    """The replay settings a v1 trainer runs with, resolved once (`replay_settings`)."""

    config: ReplayConfig
    """the `replay` group's core settings, as given"""
    settings: VerlReplaySettings
    bound: Optional[int]
    """verl's own age bound (`off_policy_bound`; the session takes min(tau_max, it))"""
    note: str
    """a line saying which bound holds"""

    @property
    def age_bound(self) -> Optional[int]:
        """The age bound replay runs with: min(tau_max, verl's)."""
        return effective_age_bound(self.config.tau_max, self.bound)


def replay_settings(config: Any) -> V1Replay:
    """The replay settings of a v1 config (`resolve_replay`) with verl's age bound and the line saying which holds."""
    cfg, settings = resolve_replay(config)
    bound = off_policy_bound(config)
    mode = config.trainer.v1.trainer_mode
    if bound is None:
        return V1Replay(cfg, settings, None, f"replay age bound: replay.tau_max={cfg.tau_max} (trainer.v1.trainer_mode={mode})")
    note = (f"replay age bound: {effective_age_bound(cfg.tau_max, bound)} versions = min(replay.tau_max={cfg.tau_max}, "
            f"trainer.v1.sampler.max_off_policy_threshold - 1 = {bound}) in {mode}")
    return V1Replay(cfg, settings, bound, note)


def check_config(config: Any, resolved: Optional[V1Replay] = None) -> None:
    """Refuse, before anything starts, what replay on verl's v1 trainer cannot run (see the module docstring).
    `resolved`: the config's `replay_settings`, when the caller has them (the trainer resolves them once)."""
    resolved = resolved or replay_settings(config)
    cfg, tau = resolved.config, resolved.age_bound
    critic = _get(config, "critic.enable")
    if _get(config, "algorithm.adv_estimator") == "gae" or critic:
        field = "critic.enable=true" if critic else "algorithm.adv_estimator='gae'"
        raise ValueError(
            f"{field}: replay stores one advantage per rollout and a critic's token-level values cannot be replayed; "
            "allowed: an outcome estimator (grpo, rloo, reinforce_plus_plus_baseline, ...) with critic.enable "
            "null/false, or plain verl (python -m verl.trainer.main_ppo) for GAE")
    check_estimator(config)
    if _get(config, "actor_rollout_ref.actor.use_prefix_grouper", False):
        raise ValueError(
            "actor_rollout_ref.actor.use_prefix_grouper=true: verl's v1 trainer does not use the prefix grouper "
            "(it would be silently ignored); allowed: false, or trainer.use_v1=false where replay supports it")
    if cfg.enabled and tau is not None and tau < 1:
        raise ValueError(
            f"trainer.v1.sampler.max_off_policy_threshold={_get(config, 'trainer.v1.sampler.max_off_policy_threshold')} lets a "
            "trajectory span one version only, so no stored row is young enough to replay; allowed: a threshold "
            ">= 2 or null, or replay=grpo (no replay)")
    check_storage(config, resolved)


def check_storage(config: Any, resolved: Optional[V1Replay] = None) -> None:
    """ValueError when TransferQueue's storage cannot hold an update's replay rows next to the rows in flight:
    its SimpleStorage refuses puts beyond `total_storage_size`, which would stop training mid-run. (Stored rows
    live in the row store; a replayed row is in TransferQueue only for the update that reads it.)"""
    resolved = resolved or replay_settings(config)
    cfg, tau = resolved.config, resolved.age_bound
    limit = _get(config, "transfer_queue.backend.SimpleStorage.total_storage_size")
    if limit is None or not cfg.enabled:
        return
    per_step = int(config.data.train_batch_size) * int(config.actor_rollout_ref.rollout.n)
    # fresh-anchored: round(ratio * fresh) replay rows; pool: fewer than the fresh rows; fill_filtered: up to
    # the filtered ones
    replay = math.ceil(max(float(cfg.replay_ratio), 1.0 if cfg.fill_filtered or cfg.composition == "pool" else 0.0)
                       * per_step)
    bounds = [b for b in (cfg.capacity, None if tau is None else tau * per_step) if b is not None]
    replay = min([replay, *bounds])
    mode = config.trainer.v1.trainer_mode
    warmup = float(_get(config, f"trainer.v1.{mode}.num_warmup_batches", 0) or 0)
    n = int(config.actor_rollout_ref.rollout.n)
    in_flight = math.ceil((1 + warmup) * int(config.data.train_batch_size)) * (n + 1)  # rollouts + prompt entries
    if replay + in_flight > int(limit):
        raise ValueError(
            f"transfer_queue.backend.SimpleStorage.total_storage_size={limit} cannot hold up to {replay} replay "
            f"rows of an update (replay.replay_ratio * train_batch_size * rollout.n) plus {in_flight} rows in "
            f"flight; allowed: total_storage_size >= {replay + in_flight}, or a smaller replay.replay_ratio"
        )


def _is_local(path: str, hub_id_ok: bool) -> bool:
    """A filesystem path, not a remote URL (`hdfs://...`) nor, where `hub_id_ok`, a hub id (`org/name`)."""
    if "://" in path:
        return False
    return not hub_id_ok or os.path.isabs(path) or path.startswith(("./", "../", "~"))


def check_paths(config: Any) -> None:
    """Local model and data paths must exist (a hub id or a remote URL is left to verl)."""
    fields = [("actor_rollout_ref.model.path", [_get(config, "actor_rollout_ref.model.path")], True)]
    tok = _get(config, "actor_rollout_ref.model.tokenizer_path")
    if tok:
        fields.append(("actor_rollout_ref.model.tokenizer_path", [tok], True))
    for key in ("train_files", "val_files"):
        files = _get(config, f"data.{key}")
        if files:
            fields.append((f"data.{key}", [files] if isinstance(files, str) else list(files), False))
    for field, paths, hub_id_ok in fields:
        for p in paths:
            if p and _is_local(str(p), hub_id_ok) and not os.path.exists(os.path.expanduser(str(p))):
                allowed = "an existing local path, a hub id or a URL" if hub_id_ok else "existing files or URLs"
                raise ValueError(f"{field}: {p} does not exist; allowed: {allowed}")


def tq_cpus(config: Any) -> tuple[int, int]:
    """(CPUs TransferQueue's placement group asks Ray for, its storage units): one per unit plus the controller."""
    units = int(_get(config, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1) or 1)
    return units + 1, units


def check_resources(config: Any, ray_cpus: Optional[float], where: str) -> None:
    """ValueError when Ray's free CPUs (`ray_cpus`, None = unknown) cannot host TransferQueue's actors."""
    need, units = tq_cpus(config)
    if ray_cpus is not None and need > ray_cpus:
        raise ValueError(
            f"transfer_queue.backend.SimpleStorage.num_data_storage_units={units}: TransferQueue asks Ray for {need} "
            f"CPUs (one per storage unit and one for its controller) but {where} has {ray_cpus:g} free, and "
            "tq.init would wait for them forever; allowed: num_data_storage_units <= "
            f"{max(0, int(ray_cpus) - 1)}, or more CPUs for Ray (ray_kwargs.ray_init.num_cpus / the cluster)")


def local_ray_cpus(config: Any) -> Optional[float]:
    """CPUs of the Ray cluster `run_ppo` will start itself (None when it joins an existing one)."""
    if os.environ.get("RAY_ADDRESS") or _get(config, "ray_kwargs.ray_init.address"):
        return None
    num = _get(config, "ray_kwargs.ray_init.num_cpus")
    return float(num) if num is not None else float(os.cpu_count() or 1)
