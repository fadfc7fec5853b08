"""`ReplayGRPOConfig`: TRL's `GRPOConfig` plus the replay settings, prefixed `replay_` and generated from
`ReplayConfig` (replay_fields.py: one field per core field, its help the core field's docstring).

Every `replay_*` field defaults to None, meaning "the preset's value"; `replay_preset` names the base
configuration (paper | grpo | uniform_pool | sigma_pool, see `ReplayConfig`). For the two fields whose
core value may be None (no age eviction, no capacity backstop) pass a negative number: `replay_tau_max=-1`
means never evict by age, `replay_capacity=-1` means unbounded. Parsed by TRL's own parsers
(`TrlParser` / `HfArgumentParser`: YAML config files and `--replay_tau_max 5` on the command line).
"""
from __future__ import annotations

from dataclasses import dataclass

from trl import GRPOConfig

from .replay_fields import REPLAY_FIELDS, ReplayFieldsMixin, check_finite, trl_replay_kwargs, with_replay_fields

__all__ = ["ReplayGRPOConfig", "REPLAY_FIELDS", "TRL_FLOATS", "trl_replay_kwargs"]

TRL_FLOATS = ("beta", "epsilon", "epsilon_high", "delta", "temperature", "top_p", "learning_rate")

@dataclass
@with_replay_fields
class ReplayGRPOConfig(ReplayFieldsMixin, GRPOConfig):
    # replay_preset, replay_seed, replay_tau_max, replay_ratio, replay_alpha, ...: with_replay_fields

    def __post_init__(self) -> None:
        super().__post_init__()
        check_finite(self, TRL_FLOATS)
        self.to_replay_config()  # a bad replay setting fails here, before any compute (ReplayConfig validates)
