"""`ReplayRayPPOTrainer`: verl 0.9.1's legacy `RayPPOTrainer` with replay at the narrowest point.

Three overrides, nothing copied from verl:
- `_update_actor(batch)`: `fit()` calls it after rewards, old log-probs, reference log-probs and advantages exist;
  the `ReplayHook` stores the fresh rows (birth step = `self.global_steps`) and concatenates replay rows, then the
  PPO mini-batch is scaled for this one call so the optimizer-step count is unchanged.
- `_save_checkpoint()` / `_load_checkpoint()`: the buffer is written to / read from
  `<default_local_dir>/global_step_<t>/replay_buffer.{npz,json}` beside verl's `actor/` and `data.pt`.

This is the legacy trainer (`trainer.use_v1=false`), which verl 0.9.1 still ships; verl's default v1 trainer,
whose rows move through TransferQueue, has its own integration in trainer_v1.py.
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
from typing import Any, Optional

from ._compat import DataProto
from .hook import ReplayHook

try:
    from omegaconf import OmegaConf, open_dict
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
except ImportError as e:  # pragma: no cover
    from ._compat import INSTALL_HINT

    raise ImportError(f"ReplayRayPPOTrainer needs verl[verl-core] (Ray): {INSTALL_HINT} ({e})") from e

logger = logging.getLogger(__name__)
BUFFER_NAME = "replay_buffer"


def replay_dict(config: Any) -> Optional[dict]:
    """The `replay` node of a verl config as a plain dict (None when absent)."""
    node = config.get("replay", None) if hasattr(config, "get") else None
    if node is None:
        return None
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)


@contextlib.contextmanager
def _override(node: Any, key: str, value: Any):
    old = node[key]
    try:
        with open_dict(node) if OmegaConf.is_config(node) else contextlib.nullcontext():
            node[key] = value
        yield
    finally:
        with open_dict(node) if OmegaConf.is_config(node) else contextlib.nullcontext():
            node[key] = old


class ReplayRayPPOTrainer(RayPPOTrainer):
    """`RayPPOTrainer` + rollout-level advantage-prioritized replay (config group `replay`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replay_hook = make_hook(self.config)

    # --- Algorithm 1 between advantages and the actor update ------------------------------------------
    def _update_actor(self, batch: DataProto) -> DataProto:
        rollout_n = int(self.config.actor_rollout_ref.rollout.n)
        actor_cfg = self.config.actor_rollout_ref.actor
        dp_size = self._get_dp_size(self.actor_rollout_wg, "actor")
        static_micro = not actor_cfg.get("use_dynamic_bsz", False)
        composed = self.replay_hook(
            batch,
            self.global_steps,
            dp_size=dp_size,
            mini_batch_rows=int(actor_cfg.ppo_mini_batch_size) * rollout_n,
            group_size=rollout_n,
            micro_batch_size_per_gpu=actor_cfg.get("ppo_micro_batch_size_per_gpu") if static_micro else None,
            prefix_grouper=bool(getattr(self, "use_prefix_grouper", False)),
        )
        plan = self.replay_hook.last_plan
        metrics = dict(plan.metrics)
        replay_token_num = composed.meta_info["global_token_num"][plan.n_fresh_used :]
        changed = plan.n_replay > 0 or plan.n_fresh_used != plan.n_fresh_total
        if self.replay_hook.settings.rebalance and self.config.trainer.balance_batch and changed:
            balance = {}
            self._balance_batch(composed, metrics=balance, logging_prefix="replay/global_seqlen")
            composed.meta_info["global_token_num"] = composed.batch["attention_mask"].sum(-1).tolist()
            metrics.update(balance)
        # verl's _update_actor passes ppo_mini_batch_size * rollout.n rows as the PPO mini-batch; scale it for
        # this call so the composed batch gives exactly plan.n_mini_batches optimizer steps per epoch.
        with _override(actor_cfg, "ppo_mini_batch_size", plan.mini_batch_rows // rollout_n):
            output = super()._update_actor(composed)
        # fit() computes perf/total_num_tokens and perf/throughput from the fresh batch's global_token_num after
        # this call: the replayed rows are trained on too, so their tokens count (nothing else reads the list).
        if "global_token_num" in batch.meta_info:
            batch.meta_info["global_token_num"] = list(batch.meta_info["global_token_num"]) + replay_token_num
        output.meta_info.setdefault("metrics", {}).update(metrics)
        return output

    # --- the buffer travels with verl's checkpoints -------------------------------------------------------
    def _save_checkpoint(self):
        # Written before verl's own save so latest_checkpointed_iteration.txt (written last) never points at a
        # folder without a buffer.
        folder = step_folder(self.config.trainer.default_local_dir, self.global_steps)
        save_buffer(self.replay_hook, folder)
        prune_buffers(self.config.trainer.default_local_dir, keep=self.config.trainer.get("max_actor_ckpt_to_keep"))
        return super()._save_checkpoint()

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        folder = resume_folder(self.config, self.global_steps)
        if folder is not None:
            load_buffer(self.replay_hook, folder)
        return out


def make_hook(config: Any) -> ReplayHook:
    cfg = replay_dict(config)
    if cfg is None:
        logger.warning("no `replay` config node: using the paper preset (ReplayConfig.paper())")
    return ReplayHook.from_dict(cfg)


def _abs(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def step_folder(default_local_dir: str, global_steps: int) -> str:
    return os.path.join(_abs(default_local_dir), f"global_step_{global_steps}")


def resume_folder(config: Any, global_steps: int) -> Optional[str]:
    """The checkpoint folder verl's `_load_checkpoint` just resumed from, or None when it started afresh."""
    if config.trainer.resume_mode == "disable" or not global_steps:
        return None
    if config.trainer.resume_mode == "resume_path":
        return _abs(config.trainer.resume_from_path)
    return step_folder(config.trainer.default_local_dir, global_steps)


def stale_buffer_folders(default_local_dir: str, keep: Optional[int]) -> list[str]:
    """The global_step folders holding a buffer, all but the newest `keep` (verl prunes actor/ the same way);
    none when `keep` is unset or not positive."""
    if not keep or keep <= 0:
        return []
    found = []
    for p in glob.glob(os.path.join(_abs(default_local_dir), "global_step_*", BUFFER_NAME + ".json")):
        with contextlib.suppress(ValueError):
            found.append((int(os.path.basename(os.path.dirname(p)).split("global_step_")[-1]), os.path.dirname(p)))
    return [folder for _, folder in sorted(found)[: max(0, len(found) - int(keep))]]


def save_buffer(hook: ReplayHook, folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, BUFFER_NAME)
    hook.save(path)
    logger.info("replay buffer (%d rollouts) saved to %s.{npz,json}", len(hook.buffer), path)
    return path


def load_buffer(hook: ReplayHook, folder: str) -> bool:
    """Load the buffer saved in `folder`. A missing file is an error unless `replay.allow_empty_resume=true`:
    a resumed run with an empty buffer silently trains without replay for up to `tau_max` steps."""
    path = os.path.join(folder, BUFFER_NAME)
    missing = [path + s for s in (".json", ".npz") if not os.path.exists(path + s)]
    if missing:
        if not hook.settings.allow_empty_resume:
            raise FileNotFoundError(
                f"resuming from {folder}: replay buffer file(s) {missing} not found. Resume from a checkpoint saved "
                "with grpo-replay, or set replay.allow_empty_resume=true to resume with an empty buffer"
            )
        logger.warning("no replay buffer at %s: resuming with an empty buffer (replay.allow_empty_resume)", missing)
        return False
    hook.load(path)
    logger.info("replay buffer (%d rollouts) loaded from %s", len(hook.buffer), path)
    return True


def prune_buffers(default_local_dir: str, keep: Optional[int]) -> None:
    """Keep the buffers of the newest `keep` global_step folders (verl prunes actor/ the same way)."""
    for folder in stale_buffer_folders(default_local_dir, keep):
        for suffix in (".json", ".npz"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, BUFFER_NAME + suffix))
