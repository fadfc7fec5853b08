"""Nested-dataclass configuration: defaults < YAML file < command line, validated before any compute.

Keys are dotted paths into the dataclass tree (`steps`, `replay.tau_max`, `loss.eps_high`). Values are
parsed as YAML scalars and type-checked against the field annotation; an unknown key suggests the closest
known one; a wrong type names the field and the expected type.
"""
from __future__ import annotations

import dataclasses
import decimal
import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..errors import ConfigError  # noqa: F401  (re-exported: the app layers raise it from here)
from ..validation import bad, field_docs, is_finite, is_int  # noqa: F401  (re-exported)


# YAML 1.1 (PyYAML) reads 1e-6, 1E6 and 1.0e6 as strings (it wants a dot and a signed exponent); YAML 1.2 and
# Python read them as numbers. A string of this form given for a float key is taken as that number.
_FLOAT_TEXT = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?")


def integral(value: Any) -> int | None:
    """value as an int when it is a whole number in any form people write one (1000, 1_000, 1e3, 1000.0, "1e3"),
    else None. Step and size counts are often written 1e3; PyYAML reads that as a string, argparse's int rejects it.
    Decimal, not float, so a long integer written in full is never rounded."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
        try:
            d = decimal.Decimal(value.strip().replace("_", ""))
        except decimal.InvalidOperation:
            return None
        # Above 10^18 no count here makes sense, and int(Decimal("1e999999")) takes half a minute to build.
        if not d.is_finite() or d.adjusted() > 18:
            return None
        return int(d) if d == d.to_integral_value() else None
    return None


def int_arg(text: str) -> int:
    """argparse `type=` for integer flags: accepts what `integral` accepts, names the forms otherwise."""
    import argparse

    n = integral(text)
    if n is None:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r} (write a whole number: 1000, 1_000 or 1e3)")
    return n


def flat_fields(cls: type, prefix: str = "") -> dict[str, tuple[Any, str]]:
    """dotted key -> (annotation, doc) for every leaf field of a nested dataclass."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out: dict[str, tuple[Any, str]] = {}
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out.update(flat_fields(t, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = (t, docs.get(f.name, ""))
    return out


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {p} must hold a mapping of keys to values, got {type(data).__name__}")
    return flatten(data)


def parse_value(text: str) -> Any:
    """A command-line value as YAML (so 3, 0.5, null, true, [1, 2] are typed); unparsable text stays a string."""
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError):
        return text


def as_given(flag: str, value: Any) -> str:
    """How a flag was typed, for the "given twice" message: `--steps 10`, `--report-to tensorboard wandb`."""
    return " ".join([flag, *map(str, value if isinstance(value, (list, tuple)) else [value])])


def parse_sets(items: list[str], given: dict[str, str] | None = None) -> dict[str, Any]:
    """`--set KEY=VALUE` items as {key: parsed value}. `given` maps keys already set on the same command line by a
    flag to how it was written (`steps` -> `--steps 10`); it is updated with the items.

    Two values for one key on one command line is a typo or a stale script line; taking the last silently would
    train with a setting its user may not have meant (`--steps 10 --set steps=1000` ran 1000 steps), so it is an error."""
    given = {} if given is None else given
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        k = k.strip()
        if k in given:
            raise ConfigError(f"{k} is given twice on the command line ({given[k]} and --set {item}); give it once")
        given[k] = f"--set {item}"
        out[k] = parse_value(v)
    return out


def check_value(key: str, value: Any, annotation: Any) -> Any:
    """Return value coerced to the annotation (int -> float, list -> tuple) or raise ConfigError."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return check_value(key, value, a)
            except ConfigError:
                pass
        raise ConfigError(f"{key}={value!r} has the wrong type; expected {_type_name(annotation)}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise ConfigError(f"{key}={value!r} is invalid; allowed: {', '.join(map(str, args))}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={value!r} has the wrong type; expected a list")
        inner = args[0] if args else Any
        return tuple(check_value(key, v, inner) for v in value)
    if annotation is Any:
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        n = integral(value)
        if n is not None:
            return n
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            return float(value.strip().replace("_", ""))
    elif annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    raise ConfigError(f"{key}={value!r} has the wrong type; expected {_type_name(annotation)}")


def _type_name(t: Any) -> str:
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(t))
    if t is type(None):
        return "null"
    if origin is tuple:
        return "a list"
    return getattr(t, "__name__", str(t))


def validate_keys(overrides: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
    for key in overrides:
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown config key {key!r}{hint}")


def build(cls: type, flat: Mapping[str, Any], prefix: str = "") -> Any:
    """Instantiate a nested dataclass from dotted, already type-checked values (defaults elsewhere)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            kwargs[f.name] = build(t, flat, key + ".")
        elif key in flat:
            kwargs[f.name] = flat[key]
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from None


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def plain(x: Any) -> Any:
    """Mappings and tuples turned into plain dicts and lists, recursively: what `yaml.safe_dump` and trackers'
    config fields accept (a tuple would be dumped as a Python-specific tag, or rejected)."""
    if isinstance(x, Mapping):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x
