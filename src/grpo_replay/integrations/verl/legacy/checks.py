"""What replay on verl's legacy `RayPPOTrainer` refuses at launch: per-row fields that the hook cannot rebuild
for a stored rollout (it keeps token ids, log-probs and scalars, not verl's whole row).

Also `replay.max_drift` (docs/verl.md). Each is a ValueError naming the setting; the entry point runs `check_config` before Ray starts and the legacy
task runner runs it again inside its actor. Multi-modal batches cannot be told from the config (the dataset
decides); the hook refuses them at the first update.
"""
from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from ..estimators import check_estimator
from ..settings import check_options, split_config

ROUTER_REPLAY_MODES = ("actor_rollout_ref.actor.megatron.router_replay.mode",
                       "actor_rollout_ref.actor.veomni.router_replay.mode")


def _get(config: Any, dotted: str, default: Any = None) -> Any:
    return OmegaConf.select(config, dotted, default=default) if OmegaConf.is_config(config) else default


def check_config(config: Any) -> None:
    """Refuse router replay, on-policy distillation and replay.max_drift on the legacy trainer (ValueError naming
    the field)."""
    replay = _get(config, "replay")
    if replay is not None:
        check_options(*split_config(OmegaConf.to_container(replay, resolve=True)), legacy=True)
    check_estimator(config, v1=False)
    for field in ROUTER_REPLAY_MODES:
        mode = _get(config, field, "disabled")
        if mode not in (None, "disabled"):
            raise ValueError(
                f"{field}={mode!r}: replay on the legacy trainer cannot rebuild a stored rollout's routed_experts "
                "(router replay); allowed: 'disabled', or trainer.use_v1=true, whose replay rows keep their own")
    if _get(config, "actor_rollout_ref.rollout.enable_rollout_routing_replay", False):
        raise ValueError(
            "actor_rollout_ref.rollout.enable_rollout_routing_replay=true: replay on the legacy trainer cannot "
            "rebuild a stored rollout's routed_experts; allowed: false, or trainer.use_v1=true")
    if _get(config, "distillation.enabled", False):
        raise ValueError(
            "distillation.enabled=true: replay on the legacy trainer cannot rebuild a stored rollout's teacher "
            "log-probs; allowed: false, or trainer.use_v1=true, whose replay rows keep their own")
