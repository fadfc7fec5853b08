"""`ReplayGRPOConfig`: TRL's `GRPOConfig` plus the replay settings, prefixed `replay_`.

Every `replay_*` field defaults to None, meaning "the preset's value"; `replay_preset` names the base
configuration (paper | grpo | uniform_pool | sigma_pool, see `ReplayConfig`). For the two fields whose
core value may be None (no age eviction, no capacity backstop) pass a negative number: `replay_tau_max=-1`
means never evict by age, `replay_capacity=-1` means unbounded. Parsed by TRL's own parsers
(`TrlParser` / `HfArgumentParser`: YAML config files and `--replay_tau_max 5` on the command line).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from trl import GRPOConfig

from ...config import PRESETS, ReplayConfig
from ...configio import bad, is_finite

TRL_FLOATS = ("beta", "epsilon", "epsilon_high", "delta", "temperature", "top_p", "learning_rate")


@dataclass
class ReplayGRPOConfig(GRPOConfig):
    replay_preset: str = field(
        default="paper",
        metadata={"help": f"Replay preset, the base of every replay_* setting: {', '.join(PRESETS)}."},
    )
    replay_tau_max: Optional[int] = field(
        default=None,
        metadata={"help": "Max rollout age in optimizer steps (paper: 10); negative = no age eviction; unset = preset."},
    )
    replay_ratio: Optional[float] = field(
        default=None,
        metadata={"help": "Replay rows per step = round(ratio * fresh rows) (paper: 0.5); 0 disables replay."},
    )
    replay_alpha: Optional[float] = field(
        default=None, metadata={"help": "Priority exponent (paper: 0.5); 0 = uniform, 1 = proportional."}
    )
    replay_priority: Optional[str] = field(
        default=None, metadata={"help": "Priority signal: abs_advantage (paper), group_std, uniform."}
    )
    replay_composition: Optional[str] = field(
        default=None, metadata={"help": "fresh_anchored (paper: concatenate) or pool (replay displaces fresh rows)."}
    )
    replay_granularity: Optional[str] = field(
        default=None, metadata={"help": "Stored/sampled unit: rollout (paper) or group."}
    )
    replay_warmup_steps: Optional[int] = field(
        default=None, metadata={"help": "Optimizer steps without replay draws at the start (paper default: 20)."}
    )
    replay_capacity: Optional[int] = field(
        default=None,
        metadata={"help": "Memory backstop: max stored rollouts per process (30000); negative = unbounded."},
    )
    replay_seed: Optional[int] = field(
        default=None,
        metadata={"help": "Seed of the buffer's sampler (process i uses seed + i); unset = the training seed."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # TRL accepts NaN/inf here; a NaN clip or KL coefficient turns every update into a silent no-op.
        for name in TRL_FLOATS:
            value = getattr(self, name, None)
            if value is not None and not is_finite(value):
                bad(self, name, "a finite number")
        self.to_replay_config()  # fail before any compute on an invalid replay setting

    def replay_overrides(self) -> dict[str, Any]:
        """The replay_* fields that were set, as `ReplayConfig` keyword arguments."""
        names = {
            "replay_tau_max": "tau_max",
            "replay_ratio": "replay_ratio",
            "replay_alpha": "alpha",
            "replay_priority": "priority",
            "replay_composition": "composition",
            "replay_granularity": "granularity",
            "replay_warmup_steps": "warmup_steps",
            "replay_capacity": "capacity",
        }
        out: dict[str, Any] = {}
        for ours, core in names.items():
            value = getattr(self, ours)
            if value is None:
                continue
            if core in ("tau_max", "capacity") and value < 0:
                value = None
            out[core] = value
        return out

    def to_replay_config(self) -> ReplayConfig:
        return ReplayConfig.from_preset(self.replay_preset, **self.replay_overrides())
