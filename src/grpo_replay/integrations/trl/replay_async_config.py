"""`ReplayAsyncGRPOConfig`: TRL's `AsyncGRPOConfig` plus the replay settings (replay_fields.py, the same `replay_*`
fields as `ReplayGRPOConfig`).

Every key either reaches TRL (all of `AsyncGRPOConfig`'s, unchanged) or the replay step, or is refused here, before
anything is loaded: NaN or infinite floats, and an age bound that cannot hold: ages are counted in model versions, the unit of `max_staleness`, and a
replayed row is at least one version old, so replay needs min(replay_tau_max, max_staleness) >= 1.
"""
from __future__ import annotations

from dataclasses import dataclass

from trl.experimental.async_grpo import AsyncGRPOConfig

from ...config import ReplayConfig
from ...errors import ConfigError
from ...session import effective_age_bound
from .replay_fields import ReplayFieldsMixin, check_finite, with_replay_fields

ASYNC_FLOATS = ("epsilon", "epsilon_high", "temperature", "top_p", "min_p", "repetition_penalty", "learning_rate")


def check_age_bound(config: ReplayConfig, max_staleness: int) -> int:
    """The effective age bound min(tau_max, max_staleness); ConfigError when replay is on and it is below 1."""
    bound = effective_age_bound(config.tau_max, max_staleness)
    if config.enabled and bound < 1:
        raise ConfigError(
            f"replay_tau_max={config.tau_max!r} with max_staleness={max_staleness!r} is invalid: a replayed row is at "
            f"least one model version old and at most min(replay_tau_max, max_staleness) = {bound}; allowed: both "
            "replay_tau_max (or -1 for no limit) and max_staleness >= 1, or replay_ratio=0"
        )
    return bound


@dataclass
@with_replay_fields
class ReplayAsyncGRPOConfig(ReplayFieldsMixin, AsyncGRPOConfig):
    # replay_preset, replay_seed, replay_tau_max, replay_ratio, replay_alpha, ...: with_replay_fields

    def __post_init__(self) -> None:
        super().__post_init__()
        check_finite(self, ASYNC_FLOATS)
        replay = self.to_replay_config()
        check_age_bound(replay, self.max_staleness)

    @property
    def replay_age_bound(self) -> int:
        """min(tau_max, max_staleness): the oldest a replayed row may be, in model versions."""
        return effective_age_bound(self.to_replay_config().tau_max, self.max_staleness)
