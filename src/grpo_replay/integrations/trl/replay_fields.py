"""The replay settings of a TRL config, prefixed `replay_` and generated from `ReplayConfig` (one field per core
field, its help the core field's docstring), shared by `ReplayGRPOConfig` and `ReplayAsyncGRPOConfig`.

Every `replay_*` field defaults to None, meaning "the preset's value"; `replay_preset` names the base
configuration (paper | grpo | uniform_pool | sigma_pool, see `ReplayConfig`). For the two fields whose
core value may be None (no age eviction, no capacity backstop) pass a negative number: `replay_tau_max=-1`
means never evict by age, `replay_capacity=-1` means unbounded. Parsed by TRL's own parsers
(`TrlParser` / `HfArgumentParser`: YAML config files and `--replay_tau_max 5` on the command line).
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import field
from typing import Any, Mapping, Optional

from ...config import PRESETS, ReplayConfig
from ...app.configio import bad, field_docs, is_finite
from ...errors import ConfigError

# ReplayConfig field -> its TRL config field: replay_<name> (replay_ratio keeps its name). Built from
# ReplayConfig itself, so a new core setting reaches TRL users without being retyped here.
REPLAY_FIELDS = {f.name: f.name if f.name.startswith("replay_") else f"replay_{f.name}" for f in dataclasses.fields(ReplayConfig)}
_HINTS = typing.get_type_hints(ReplayConfig)


def _nullable(core: str) -> bool:
    """Whether None is a value of the core field (tau_max: no age eviction, capacity: unbounded)."""
    return type(None) in typing.get_args(_HINTS[core])


def with_replay_fields(cls: type) -> type:
    """Add `replay_preset`, `replay_seed` and one `replay_*` field per `ReplayConfig` field (before @dataclass sees
    the class): type Optional[core type], default None (= the preset's value), help = the core field's docstring."""
    if "__annotations__" not in cls.__dict__:  # a class body without annotations of its own
        cls.__annotations__ = {}
    annotations = cls.__dict__["__annotations__"]
    annotations["replay_preset"] = str
    cls.replay_preset = field(
        default="paper", metadata={"help": f"Replay preset, the base of every replay_* setting: {', '.join(PRESETS)}."}
    )
    annotations["replay_seed"] = Optional[int]
    cls.replay_seed = field(
        default=None,
        metadata={"help": "Seed of the buffer's sampler (process i uses seed + i); unset = the training seed."},
    )
    docs, paper = field_docs(ReplayConfig), ReplayConfig.paper()
    for core, ours in REPLAY_FIELDS.items():
        core_type = next(a for a in typing.get_args(_HINTS[core]) or (_HINTS[core],) if a is not type(None))
        unset = f"Paper: {getattr(paper, core)}; unset = the preset's value" + ("; negative = None." if _nullable(core) else ".")
        annotations[ours] = Optional[core_type]
        setattr(cls, ours, field(default=None, metadata={"help": f"{docs[core]} {unset}"}))
    return cls


def trl_replay_kwargs(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`ReplayConfig` keyword arguments as TRL config ones (a None core value becomes -1)."""
    return {REPLAY_FIELDS[k]: (-1 if v is None and _nullable(k) else v) for k, v in overrides.items()}


def check_finite(config: Any, names: tuple[str, ...]) -> None:
    """ConfigError for the first of `names` that is NaN or infinite (TRL accepts them: a NaN clip or learning rate
    turns every update into a silent no-op)."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None and not is_finite(value):
            bad(config, name, "a finite number")


class ReplayFieldsMixin:
    """`replay_overrides` / `to_replay_config` of a config class decorated with `with_replay_fields`."""

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


def resolve_replay_config(trainer: str, args: Any, replay_config: Optional[ReplayConfig]) -> ReplayConfig:
    """A trainer's replay settings: from `args` when it is a replay config (it has `to_replay_config`), else from
    `replay_config`, else the paper preset. Both given: they must agree, else ConfigError naming every field that
    differs (one setting from two sources would leave one of them silently unused)."""
    to_cfg = getattr(args, "to_replay_config", None)
    from_args = to_cfg() if to_cfg is not None else None
    if replay_config is None:
        return from_args if from_args is not None else ReplayConfig.paper()
    if from_args is None or from_args == replay_config:
        return replay_config
    differ = [f"{REPLAY_FIELDS[k]}: args gives {v!r}, replay_config gives {getattr(replay_config, k)!r}"
              for k, v in from_args.to_dict().items() if v != getattr(replay_config, k)]
    raise ConfigError(
        f"{trainer}: the replay settings come from two sources that differ ({'; '.join(differ)}); allowed: the "
        f"replay_* fields of args ({type(args).__name__}) alone, replay_config with a plain TRL config, or both equal"
    )
