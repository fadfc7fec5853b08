"""`ReplayGRPOConfig`: TRL's `GRPOConfig` plus the replay settings, prefixed `replay_` and generated from
`ReplayConfig` (one field per core field, its help the core field's docstring).

Every `replay_*` field defaults to None, meaning "the preset's value"; `replay_preset` names the base
configuration (paper | grpo | uniform_pool | sigma_pool, see `ReplayConfig`). For the two fields whose
core value may be None (no age eviction, no capacity backstop) pass a negative number: `replay_tau_max=-1`
means never evict by age, `replay_capacity=-1` means unbounded. Parsed by TRL's own parsers
(`TrlParser` / `HfArgumentParser`: YAML config files and `--replay_tau_max 5` on the command line).
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from trl import GRPOConfig

from ...config import PRESETS, ReplayConfig, refuse_options
from ...app.configio import bad, field_docs, is_finite

TRL_FLOATS = ("beta", "epsilon", "epsilon_high", "delta", "temperature", "top_p", "learning_rate")

# ReplayConfig field -> its ReplayGRPOConfig field: replay_<name> (replay_ratio keeps its name). Built from
# ReplayConfig itself, so a new core setting reaches TRL users without being retyped here.
# TRL computes the loss itself: bounding a replay row's drift would need its current log-probs before the loss
# and a renormalised num_items_in_batch (docs/method.md); its own off_policy_mask_threshold is a different rule.
TRL_REFUSED = ("max_drift",)
REPLAY_FIELDS = {f.name: f.name if f.name.startswith("replay_") else f"replay_{f.name}" for f in dataclasses.fields(ReplayConfig)}
_HINTS = typing.get_type_hints(ReplayConfig)


def _nullable(core: str) -> bool:
    """Whether None is a value of the core field (tau_max: no age eviction, capacity: unbounded)."""
    return type(None) in typing.get_args(_HINTS[core])


def _with_replay_fields(cls: type) -> type:
    """Add one `replay_*` field per `ReplayConfig` field (before @dataclass sees the class): type Optional[core
    type], default None (= the preset's value), help = the core field's docstring."""
    annotations = cls.__dict__["__annotations__"]
    docs, paper = field_docs(ReplayConfig), ReplayConfig.paper()
    for core, ours in REPLAY_FIELDS.items():
        core_type = next(a for a in typing.get_args(_HINTS[core]) or (_HINTS[core],) if a is not type(None))
        unset = f"Paper: {getattr(paper, core)}; unset = the preset's value" + ("; negative = None." if _nullable(core) else ".")
        annotations[ours] = Optional[core_type]
        setattr(cls, ours, field(default=None, metadata={"help": f"{docs[core]} {unset}"}))
    return cls


def trl_replay_kwargs(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`ReplayConfig` keyword arguments as `ReplayGRPOConfig` ones (a None core value becomes -1)."""
    return {REPLAY_FIELDS[k]: (-1 if v is None and _nullable(k) else v) for k, v in overrides.items()}


@dataclass
@_with_replay_fields
class ReplayGRPOConfig(GRPOConfig):
    replay_preset: str = field(
        default="paper",
        metadata={"help": f"Replay preset, the base of every replay_* setting: {', '.join(PRESETS)}."},
    )
    replay_seed: Optional[int] = field(
        default=None,
        metadata={"help": "Seed of the buffer's sampler (process i uses seed + i); unset = the training seed."},
    )
    # + replay_tau_max, replay_ratio, replay_alpha, ...: one per ReplayConfig field (_with_replay_fields)

    def __post_init__(self) -> None:
        super().__post_init__()
        # TRL accepts NaN/inf here; a NaN clip or KL coefficient turns every update into a silent no-op.
        for name in TRL_FLOATS:
            value = getattr(self, name, None)
            if value is not None and not is_finite(value):
                bad(self, name, "a finite number")
        refuse_options(self.to_replay_config(), "TRL", TRL_REFUSED)  # fail before any compute on a bad replay setting

    def replay_overrides(self) -> dict[str, Any]:
        """The replay_* fields that were set, as `ReplayConfig` keyword arguments."""
        out: dict[str, Any] = {}
        for core, ours in REPLAY_FIELDS.items():
            value = getattr(self, ours)
            if value is None:
                continue
            if _nullable(core) and value < 0:
                value = None
            out[core] = value
        return out

    def to_replay_config(self) -> ReplayConfig:
        return ReplayConfig.from_preset(self.replay_preset, **self.replay_overrides())
