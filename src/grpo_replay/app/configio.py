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
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..errors import ConfigError
from ..validation import bad, field_docs, field_groups, is_finite, is_int  # noqa: F401  (re-exported)


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


def nonempty(text: str) -> str:
    """argparse `type=` for a path or name flag: an empty value (`--out "$DIR"` with DIR unset) is refused, not read
    as "not given" (the default) or as the current directory."""
    import argparse

    if not text.strip():
        raise argparse.ArgumentTypeError("empty value; give a path or name")
    return text


def path_arg(text: str) -> str:
    """argparse `type=` for a path flag: `nonempty`, with a leading `~` expanded as the shell would (a quoted
    `--out "~/x"`, from a script or a config, reaches the command unexpanded: never a directory named `~`)."""
    return os.path.expanduser(nonempty(text))


def nonempty_path(text: str) -> Path:
    return Path(path_arg(text))


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


def flatten(d: Mapping[str, Any], prefix: str = "", where: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys. A key reached twice (`replay.tau_max` written dotted and nested) is a
    ConfigError naming it (`where` says in what), never one value silently winning."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        items = flatten(v, f"{prefix}{k}.", where).items() if isinstance(v, Mapping) else [(f"{prefix}{k}", v)]
        for key, value in items:
            if key in out:
                raise ConfigError(f"{key} is given twice{where} (dotted and nested, or twice); give it once")
            out[key] = value
    return out


# YAML 1.1 (PyYAML) reads 010 as octal 8, 0x10 as 16 and 1:30 as 90, while a flag (`--steps 010`) reads 10 and
# refuses 0x10. One loader for config files and `--set` values makes them agree: a number with leading zeros is
# decimal, the other integer forms stay text (so an int key refuses them); and a mapping with a key twice is refused.
_DECIMAL_INT = re.compile(r"[-+]?[0-9][0-9_]*")


class PlainScalar(str):
    """An unquoted YAML scalar that YAML reads as a number or a boolean, kept as the text it was written as
    (`value` is what YAML reads). `check_value` gives a key typed str the text and any other key the value, so
    `out_dir: 007` is the directory 007, not 7, and `steps: 010` is still 10."""

    value: Any

    def __new__(cls, text: str, value: Any) -> "PlainScalar":
        self = super().__new__(cls, text)
        self.value = value
        return self


class _Loader(yaml.SafeLoader):
    pass


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    text = loader.construct_scalar(node)
    if _DECIMAL_INT.fullmatch(text):
        return PlainScalar(text, int(text.replace("_", "")))
    return text


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    text = loader.construct_scalar(node)
    return text if ":" in text else PlainScalar(text, loader.construct_yaml_float(node))  # 1:30.5 (base 60) stays text


def _construct_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    return PlainScalar(loader.construct_scalar(node), loader.construct_yaml_bool(node))


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
    seen: set = set()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise ConfigError(f"key {key!r} is given twice (line {key_node.start_mark.line + 1}); give it once")
        if _is_empty(value_node):
            raise ConfigError(f"empty value for {key!r} (line {key_node.start_mark.line + 1}); write null to unset it")
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
def _is_empty(node: yaml.Node) -> bool:
    # `tau_max:` with nothing after it is YAML's null, but in a config it is far more often a template's unset
    # variable than a wish to switch the setting off; null must be written out.
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null" and node.value == ""


def _construct_null(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> None:
    if _is_empty(node):
        raise ConfigError(f"empty value (line {node.start_mark.line + 1}); write null to unset it")
    return None


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:null", _construct_null)


def yaml_load(text: str) -> Any:
    """`yaml.safe_load` with the rules above (decimal leading zeros, no base 8/16/60 numbers, no repeated keys)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = yaml_load(p.read_text(encoding="utf-8"))
    except ConfigError as e:
        raise ConfigError(f"config file {p}: {e}") from None
    except (yaml.YAMLError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {p} must hold a mapping of keys to values, got {type(data).__name__}")
    return flatten(data, where=f" in config file {p}")


def parse_value(text: str) -> Any:
    """A command-line value as YAML (so 3, 0.5, null, true, [1, 2] are typed); unparsable text stays a string."""
    try:
        return yaml_load(text)
    except (yaml.YAMLError, ValueError, RecursionError):
        return text


def once() -> type:
    """An argparse store action that refuses its flag given a second time (`--steps 3 --steps 5`) instead of
    letting the last one win silently, as a key given twice by `--set` is refused."""
    import argparse

    class Once(argparse._StoreAction):
        def __call__(self, parser, namespace, values, option_string=None):
            seen = namespace.__dict__.setdefault("_flags_given", {})
            if self.dest in seen:
                parser.error(f"{option_string} is given twice ({seen[self.dest]} and {as_given(option_string, values)}); give it once")
            seen[self.dest] = as_given(option_string, values)
            super().__call__(parser, namespace, values, option_string)

    return Once


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
        if not v.strip():  # an unset shell variable (`--set replay.tau_max=$TAU`), never YAML's null
            raise ConfigError(f"empty value for {k} (--set {item}); give a value, or {k}=null to unset an optional key")
        out[k] = parse_value(v)
    return out


def _takes_text(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return str in typing.get_args(annotation)
    return annotation is str


def check_value(key: str, value: Any, annotation: Any) -> Any:
    """Return value coerced to the annotation (int -> float, list -> tuple) or raise ConfigError."""
    if isinstance(value, PlainScalar):
        value = str(value) if _takes_text(annotation) else value.value
    if isinstance(value, str) and not value.strip() and annotation is not Any:
        # `--model "$MODEL"` with MODEL unset: an empty path or name would read as "not given" downstream.
        unset = ", or null to unset it" if type(None) in typing.get_args(annotation) else ""
        raise ConfigError(f"empty value for {key} ({value!r}); give a value{unset}")
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
