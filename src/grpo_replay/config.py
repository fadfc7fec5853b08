"""`ReplayConfig`: the one configuration of the replay method, with presets for the paper's arms.

Every field is validated at construction, so an invalid setting fails before any compute.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from .composition import COMPOSITIONS
from .validation import bad, is_finite, is_int
from .priority import PRIORITIES

GRANULARITIES = ("rollout", "group")


@dataclass(frozen=True)
class ReplayConfig:
    """Replay settings (docs/method.md, "Defaults"). The defaults are the paper's method."""

    tau_max: Optional[int] = 10
    """Maximum age in optimizer steps (step - birth_step) a rollout may have when sampled; None = never evict by age."""
    replay_ratio: float = 0.5
    """Replay rows per step = round(replay_ratio * n_fresh) (fresh_anchored); 0 disables replay (plain GRPO)."""
    alpha: float = 0.5
    """Priority exponent: P(i) proportional to (p_i + eps)^alpha; 0 = uniform, 1 = proportional."""
    eps: float = 1e-6
    """Added to the priority signal so a rollout with |A_i| = 0 can still be drawn."""
    priority: str = "abs_advantage"
    """Priority signal by name: abs_advantage (|A_i|, the paper's), group_std (sigma_g, query level), uniform."""
    composition: str = "fresh_anchored"
    """How replay rows join the fresh batch: fresh_anchored (concatenate) or pool (replay displaces fresh rows)."""
    granularity: str = "rollout"
    """Unit that is stored and sampled: rollout (individual rollouts, the paper's) or group (whole groups, naive)."""
    warmup_steps: int = 20
    """Steps at the start of training without replay draws (the buffer still fills)."""
    capacity: Optional[int] = 30_000
    """Memory backstop: at most this many stored rollouts, oldest evicted first; None = unbounded."""
    replacement: bool = False
    """Draw with replacement within a step (default: without, so a rollout appears at most once per batch)."""
    max_drift: Optional[float] = None
    """Beyond the paper. Drift bound per replayed row: the row's mean per-token k3 estimate of KL(behaviour ||
    current) on the update's own forward pass; a row above it is masked out of that update's loss and evicted.
    None = no bound (the paper's: age alone bounds staleness)."""
    fill_filtered: bool = False
    """Beyond the paper. The step's replay count is the number of fresh rows the zero-variance filter removed
    (replacing round(replay_ratio * n_fresh)), so the update has as many rows as were generated; needs
    composition fresh_anchored and replay_ratio > 0 (replay on); warm-up still draws none."""
    max_uses: Optional[int] = None
    """Beyond the paper. A stored row is evicted once it has been replayed this many times; None = no limit."""
    age_decay: Optional[float] = None
    """Beyond the paper. Priority multiplied by exp(-age / age_decay) at draw time (age = step - birth_step);
    None = no decay (the paper's: priorities are frozen at insertion)."""

    def __post_init__(self) -> None:
        # Every float must be finite: replay_ratio=inf overflows mid-run, a NaN compares False everywhere.
        if self.tau_max is not None and (not is_int(self.tau_max) or self.tau_max < 0):
            bad(self, "tau_max", "an integer >= 0 or None")
        if not is_finite(self.replay_ratio) or self.replay_ratio < 0:
            bad(self, "replay_ratio", "a finite number >= 0")
        if not is_finite(self.alpha) or self.alpha < 0:
            bad(self, "alpha", "a finite number >= 0")
        if not is_finite(self.eps) or self.eps <= 0:
            bad(self, "eps", "a finite number > 0")
        # Names are checked against the live registries, so a registered variant is valid here at once.
        if self.priority not in PRIORITIES.names():
            bad(self, "priority", ", ".join(PRIORITIES.names()))
        if self.composition not in COMPOSITIONS.names():
            bad(self, "composition", ", ".join(COMPOSITIONS.names()))
        if self.granularity not in GRANULARITIES:
            bad(self, "granularity", ", ".join(GRANULARITIES))
        if not is_int(self.warmup_steps) or self.warmup_steps < 0:
            bad(self, "warmup_steps", "an integer >= 0")
        if self.capacity is not None and (not is_int(self.capacity) or self.capacity < 1):
            bad(self, "capacity", "an integer >= 1 or None")
        if not isinstance(self.replacement, bool):
            bad(self, "replacement", "true or false")
        if self.max_drift is not None and (not is_finite(self.max_drift) or self.max_drift <= 0):
            bad(self, "max_drift", "a finite number > 0 or None")
        if not isinstance(self.fill_filtered, bool):
            bad(self, "fill_filtered", "true or false")
        if self.fill_filtered and self.composition != "fresh_anchored":
            bad(self, "fill_filtered", f"false with composition={self.composition!r} (filling needs fresh_anchored)")
        if self.fill_filtered and not self.enabled:
            bad(self, "fill_filtered", "false with replay_ratio=0 (replay is off)")
        if self.max_uses is not None and (not is_int(self.max_uses) or self.max_uses < 1):
            bad(self, "max_uses", "an integer >= 1 or None")
        if self.age_decay is not None and (not is_finite(self.age_decay) or self.age_decay <= 0):
            bad(self, "age_decay", "a finite number > 0 or None")

    @property
    def enabled(self) -> bool:
        return self.replay_ratio > 0

    # --- presets: each names a whole configuration -------------------------------------------------
    @classmethod
    def paper(cls, **overrides: Any) -> "ReplayConfig":
        """The paper's method: age eviction tau_max=10, fresh-anchored composition, rollout-level |A_i| priority."""
        return cls(**overrides)

    @classmethod
    def grpo(cls, **overrides: Any) -> "ReplayConfig":
        """Plain GRPO: no replay rows ever."""
        return cls(**{"replay_ratio": 0.0, **overrides})

    @classmethod
    def uniform_pool(cls, **overrides: Any) -> "ReplayConfig":
        """Naive baseline: whole groups stored, drawn uniformly, mixed into a fixed-size pool."""
        base = dict(priority="uniform", composition="pool", granularity="group")
        return cls(**{**base, **overrides})

    @classmethod
    def sigma_pool(cls, **overrides: Any) -> "ReplayConfig":
        """Naive baseline: whole groups stored, drawn by group reward std sigma_g, mixed into a fixed-size pool."""
        base = dict(priority="group_std", composition="pool", granularity="group")
        return cls(**{**base, **overrides})

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "ReplayConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; allowed: {', '.join(PRESETS)}")
        return getattr(cls, name)(**overrides)

    def replace(self, **changes: Any) -> "ReplayConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PRESETS = ("paper", "grpo", "uniform_pool", "sigma_pool")
OPTIONS = ("max_drift", "fill_filtered", "max_uses", "age_decay")  # beyond the paper: docs/method.md


def refuse_options(config: ReplayConfig, engine: str, names: tuple[str, ...] = OPTIONS) -> None:
    """Raise ConfigError (exit 2) for the first option of `names` set away from its default: for an engine
    that does not implement them, so that a setting it accepts always takes effect."""
    defaults = ReplayConfig()
    for name in names:
        if getattr(config, name) != getattr(defaults, name):
            bad(config, name, f"{getattr(defaults, name)} (the {engine} integration does not implement {name} yet)")

