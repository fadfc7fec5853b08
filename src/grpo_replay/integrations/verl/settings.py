"""The verl `replay` group as the core's `ReplayConfig` plus the integration's own `VerlReplaySettings`.

Both trainers (v1 and legacy) resolve the group once, when they are built (`resolve_replay`, through
`split_config`), and read the result at every step; the Hydra files in config/replay/ are generated from these two
dataclasses (replay_group.py).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import OmegaConf

from ...config import ReplayConfig, refuse_options
from ...validation import bad as bad_field

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerlReplaySettings:
    """Integration knobs that the core `ReplayConfig` does not have (the Hydra group holds both)."""

    filter_zero_variance: bool = True
    """Drop zero-reward-variance groups from the actor update (Algorithm 1 step 3). They are never inserted."""
    keep_optimizer_steps: bool = True
    """Scale the PPO mini-batch to total / K rows so the number of optimizer steps per step is unchanged.
    False: keep verl's mini-batch size; the total is then a multiple of it and replay adds optimizer steps."""
    seed: int = 0
    """Seed of the buffer's sampling generator."""
    rebalance: bool = True
    """Re-run verl's DP sequence-length balancing over the composed batch (if `trainer.balance_batch`)."""
    allow_empty_resume: bool = False
    """Resuming from a checkpoint folder without the buffer files starts with an empty buffer instead of failing."""


SETTINGS_FIELDS = tuple(VerlReplaySettings.__dataclass_fields__)
CONFIG_FIELDS = tuple(ReplayConfig.__dataclass_fields__)


def split_config(cfg: Optional[dict[str, Any]]) -> tuple[ReplayConfig, VerlReplaySettings]:
    """Hydra `replay` group (a plain dict; `preset` optional) -> (ReplayConfig, VerlReplaySettings).

    Unknown keys are an error, so a typo fails before any compute."""
    cfg = dict(cfg or {})
    preset = cfg.pop("preset", None) or "paper"
    unknown = sorted(set(cfg) - set(CONFIG_FIELDS) - set(SETTINGS_FIELDS))
    if unknown:
        raise ValueError(f"unknown replay config keys {unknown}; allowed: {sorted(CONFIG_FIELDS + SETTINGS_FIELDS)}")
    config = ReplayConfig.from_preset(preset, **{k: v for k, v in cfg.items() if k in CONFIG_FIELDS})
    settings = VerlReplaySettings(**{k: v for k, v in cfg.items() if k in SETTINGS_FIELDS})
    check_options(config, settings)
    return config, settings


def resolve_replay(config: Any) -> tuple[ReplayConfig, VerlReplaySettings]:
    """The `replay` group of a verl config as (ReplayConfig, VerlReplaySettings) (`split_config`): what a trainer
    reads at construction and keeps. Without a `replay` node, the paper preset (with a warning)."""
    cfg = replay_dict(config)
    if cfg is None:
        logger.warning("no `replay` config node: using the paper preset (ReplayConfig.paper())")
    return split_config(cfg)


def check_options(config: ReplayConfig, settings: VerlReplaySettings, legacy: bool = False) -> None:
    """Raise ConfigError for an option beyond the paper that a verl trainer cannot honour (docs/method.md). The
    legacy trainer refuses max_drift: it would need each replay row's log-probs under the current policy before the
    update (the v1 trainer has its actor compute them); fill_filtered needs the filter on."""
    if legacy:
        refuse_options(config, "verl legacy", ("max_drift",))
    if config.fill_filtered and not settings.filter_zero_variance:
        bad_field(config, "fill_filtered", "false with filter_zero_variance=false (no rows are filtered to fill)")


def replay_dict(config: Any) -> Optional[dict]:
    """The `replay` node of a verl config as a plain dict (None when absent)."""
    node = config.get("replay", None) if hasattr(config, "get") else None
    if node is None:
        return None
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
