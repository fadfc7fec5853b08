"""A replay buffer's saved state: writing it, reading it back and validating every field.

`ReplayBuffer.save(path)` writes `<path>.npz` (the arrays, no pickled objects) and `<path>.json` (everything
else, with a SHA-256 checksum over both), the full name kept and the extensions appended, so
`buffer.step1` and `buffer.step2` never collide. Loading checks the checksum (files of version 1, written
before it existed, have none), then every field: the header here (version, config, generator, counters), the
storage's own fields by the storage's rules (storage_state.py: dtypes, shapes, the slot layout, completion
lengths that match the masks, ...), then the buffer's rules over the stored rows (weights equal to the
priority recomputed from the advantages, birth steps not after the buffer's last step, ...). Every problem
raises `BufferStateError` naming the file and the field.
"""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
import zlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Optional

import numpy as np

from . import storage_state
from .errors import UsageError
from .storage_state import is_integer

STATE_VERSION = 5
# 1: no checksum and no "step" (its birth-step bound is then the newest birth step); 1 and 2: "totals" is a
# list [added, evicted by age, evicted by capacity] (3: an object with those names, OLD_TOTALS); 1-3: no
# "col.uses", no evicted_uses / evicted_drift totals and no max_drift, fill_filtered, max_uses, age_decay in
# "config" (`upgrade` reads them as 0 and the defaults: those files predate the options); 1-4: no
# "storage_scalars.widths" (the arenas are then sized to the widest stored row)
READABLE_VERSIONS = (1, 2, 3, 4, 5)
OLD_TOTALS = ("added", "evicted_age", "evicted_capacity")
CHECKSUM_VERSIONS = (3, 4, 5)  # the versions whose checksum is verified (the same function since version 3)
NEW_CONFIG_FIELDS = ("max_drift", "fill_filtered", "max_uses", "age_decay")
JSON_KEYS = {"version", "config", "rng", "next_group", "totals", "step", "sampler", "age_eviction",
             "capacity_eviction", "storage_scalars", "checksum"}


@dataclass
class BufferTotals:
    """A buffer's lifetime row counts: rows added, and rows evicted by each cause. Invariant (kept by
    `ReplayBuffer`): added == stored + the four evicted counts. Saved as the state's "totals" (`TOTALS` keys)."""

    added: int = 0
    evicted_age: int = 0  # older than tau_max
    evicted_capacity: int = 0  # past the capacity backstop
    evicted_uses: int = 0  # replayed max_uses times
    evicted_drift: int = 0  # evicted by a caller for drift (`ReplayBuffer.evict_rows`)

    def evicted(self) -> int:
        return self.evicted_age + self.evicted_capacity + self.evicted_uses + self.evicted_drift

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


TOTALS = tuple(f.name for f in fields(BufferTotals))  # OLD_TOTALS, then evicted_uses and evicted_drift


class BufferStateError(UsageError):
    """A saved replay buffer (or a state dict) that cannot be loaded; the message names the file and field."""


def paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """(<path>.npz, <path>.json): the whole name kept, extensions appended (no with_suffix: `buffer.step1` stays);
    a path given with either extension (`b.npz`, the file people expect) names the same pair (b.npz, b.json)."""
    p = os.fspath(path)
    for ext in (".npz", ".json"):
        if p.endswith(ext) and len(os.path.basename(p)) > len(ext):
            p = p[: -len(ext)]
    return Path(p + ".npz"), Path(p + ".json")


def checksum(state: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(json.dumps({k: v for k, v in state.items() if k != "checksum"}, sort_keys=True).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def write(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Write a `ReplayBuffer.state_dict()`; the JSON last, so its presence means both files are complete."""
    npz, js = paths(path)
    npz.parent.mkdir(parents=True, exist_ok=True)  # else open() fails naming the temp file, not the path given
    state = dict(state)
    storage = state.pop("storage")
    arrays = {k: v for k, v in storage.items() if isinstance(v, np.ndarray)}
    state["storage_scalars"] = {k: _plain(v) for k, v in storage.items() if not isinstance(v, np.ndarray)}
    state["checksum"] = checksum(state, arrays)
    _atomic_write(npz, lambda f: np.savez(f, **arrays))
    _atomic_write(js, lambda f: f.write(json.dumps(state).encode()))


def read(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, str]]:
    """The state dict saved at `path` (checksum verified, not yet validated) and the file of each field."""
    npz, js = paths(path)
    try:
        state = json.loads(js.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise BufferStateError(f"{js}: replay buffer state file does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise BufferStateError(f"{js}: not a valid replay buffer state file: {e}") from None
    if not isinstance(state, dict):
        raise BufferStateError(f"{js}: must hold a JSON object, not {type(state).__name__}")
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(npz, allow_pickle=False) as z:
            for k in z.files:
                try:
                    arrays[k] = z[k]
                except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as e:
                    raise BufferStateError(f"{npz}: field {k!r} cannot be read: {e}") from None
    except FileNotFoundError:
        raise BufferStateError(f"{npz}: replay buffer arrays file does not exist") from None
    except BufferStateError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as e:
        raise BufferStateError(f"{npz}: not a valid replay buffer arrays file (npz): {e}") from None
    where = {"json": str(js), "npz": str(npz)}
    if state.get("version") in CHECKSUM_VERSIONS:
        if not isinstance(state.get("checksum"), str):
            raise BufferStateError(f"{js}: field 'checksum' is missing or not a string")
        if checksum(state, arrays) != state["checksum"]:
            raise BufferStateError(
                f"{js}: field 'checksum' does not match the contents of {js.name} and {npz.name} "
                "(the files were changed or mixed up after saving)"
            )
    scalars = state.pop("storage_scalars", None)
    if not isinstance(scalars, dict):
        raise BufferStateError(f"{js}: field 'storage_scalars' is missing or not an object")
    overlap = set(scalars) & set(arrays)
    if overlap:
        raise BufferStateError(f"{npz}: field {sorted(overlap)[0]!r} is also in {js.name}")
    state["storage"] = {**arrays, **scalars}
    state.pop("checksum", None)
    return state, where


def totals(value: Any, version: int = STATE_VERSION) -> dict[str, int]:
    """The counters of a state's "totals": an object keyed by TOTALS (versions 1-3: OLD_TOTALS, the others
    0), or (versions 1-2) a list in OLD_TOTALS' order. Raises ValueError unless each is an integer >= 0."""
    names = TOTALS if version >= 4 else OLD_TOTALS
    if isinstance(value, list) and len(value) == len(OLD_TOTALS) and version <= 2:
        value = dict(zip(OLD_TOTALS, value))
    if not (isinstance(value, dict) and set(value) == set(names) and all(is_integer(x) and x >= 0 for x in value.values())):
        raise ValueError(f"must be an object {{{', '.join(names)}}} of integers >= 0")
    return {k: int(value.get(k, 0)) for k in TOTALS}


def upgrade(state: Any) -> Any:
    """A state of version 1-3 with what version 4 added filled in: "col.uses" zeros (no row had been counted)
    and the options' defaults in "config". Anything else is returned as it is (`validate` judges it)."""
    if not isinstance(state, dict) or state.get("version") not in (1, 2, 3):
        return state
    state = dict(state)
    st, cfg = state.get("storage"), state.get("config")
    if isinstance(st, dict) and "col.uses" not in st and isinstance(st.get("valid"), np.ndarray):
        state["storage"] = {**st, "col.uses": np.zeros(len(st["valid"]), np.int64)}
    if isinstance(cfg, dict):
        from .config import ReplayConfig

        defaults = ReplayConfig().to_dict()
        state["config"] = {**{k: defaults[k] for k in NEW_CONFIG_FIELDS}, **cfg}
    return state


def validate(state: Any, config, where: dict[str, str], parts: Optional[dict[str, Any]] = None) -> None:
    """Raise BufferStateError unless `state` is a loadable state dict for a buffer with `config` and these
    parts (name -> `BufferPart`; a stateless part's saved state must be {})."""
    js, npz = where["json"], where["npz"]

    def bad(field: str, problem: str, file: str = js) -> None:
        raise BufferStateError(f"{file}: field {field!r} {problem}")

    if not isinstance(state, dict):
        raise BufferStateError(f"{js}: a replay buffer state must be a dict, not {type(state).__name__}")
    version = _validate_header(state, config, parts or {}, bad)
    st = state["storage"]
    if not isinstance(st, dict):
        bad("storage", "must be a dict")
    rows = storage_state.check(st, bad, npz, widths_required=version >= 5)
    _validate_rows(state, rows, config, version, bad, npz)


def _validate_header(state: Any, config, parts: dict[str, Any], bad) -> int:
    """The JSON side: version, keys, config, generator, parts, counters. Returns the version."""
    from .config import ReplayConfig

    version = state.get("version")
    if not is_integer(version) or version not in READABLE_VERSIONS:
        bad("version", f"is {version!r}; readable versions: {', '.join(map(str, READABLE_VERSIONS))}")
    required = JSON_KEYS - {"checksum", "storage_scalars"} - ({"step"} if version == 1 else set())
    for k in sorted(required | {"storage"}):
        if k not in state:
            bad(k, "is missing")
    for k in sorted(set(state) - JSON_KEYS - {"storage"}):
        bad(k, "is not a replay buffer state field")
    cfg = state["config"]
    if not isinstance(cfg, dict):
        bad("config", "must be an object")
    try:
        ReplayConfig(**cfg)
    except (TypeError, ValueError) as e:
        bad("config", f"is not a valid ReplayConfig: {e}")
    if cfg != config.to_dict():
        bad("config", f"replay buffer state was saved with config {cfg}, this buffer has {config.to_dict()}")
    try:
        np.random.default_rng().bit_generator.state = state["rng"]
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        bad("rng", f"is not a PCG64 generator state: {e!r}")
    for k in ("sampler", "age_eviction", "capacity_eviction"):
        stateless = getattr(parts.get(k), "STATELESS", True)
        if not isinstance(state[k], dict) or (stateless and state[k] != {}):
            bad(k, "must be {} (these parts keep no state)" if stateless else "must be an object")
    if not is_integer(state["next_group"]) or state["next_group"] < 0:
        bad("next_group", "must be an integer >= 0")
    try:
        totals(state["totals"], version)
    except ValueError as e:
        bad("totals", str(e))
    step = state.get("step")
    if step is not None and not is_integer(step):
        bad("step", "must be an integer or null")
    return version


def _validate_rows(state: dict, col: dict[str, np.ndarray], config, version: int, bad, npz: str) -> None:
    """The buffer's rules over the stored rows (`col`: their columns, from `storage_state.check`): weights
    equal to the config's priority, birth steps, group ids and replay counts within the header's bounds, and
    totals that add up to the stored rows."""
    from .priority import PRIORITIES

    count = state["storage"]["count"]
    expected = PRIORITIES.get(config.priority)(col, config)
    if not np.array_equal(col["weight"], expected):
        bad("col.weight", f"does not equal the {config.priority} priority of the stored advantages "
            "(weights are frozen at insertion: negative, NaN or edited weights are refused)", npz)
    step = state.get("step")
    if count:
        newest = int(col["birth_step"].max())
        if version >= 2 and (step is None or newest > step):
            bad("col.birth_step", f"holds birth step {newest}, after the buffer's last step {step}", npz)
    if count and ((col["group_key"] < 0).any() or (col["group_key"] >= state["next_group"]).any()):
        bad("col.group_key", f"must lie in [0, next_group={state['next_group']})", npz)
    # A row replayed max_uses times is evicted by that draw: no stored row has reached the limit.
    limit = config.max_uses
    if (col["uses"] < 0).any() or (limit is not None and (col["uses"] >= limit).any()):
        bad("col.uses", "must be replay counts >= 0" + (f" and < max_uses={limit}" if limit is not None else ""), npz)
    t = totals(state["totals"], version)
    evicted = {k: v for k, v in t.items() if k != "added"}
    if t["added"] != count + sum(evicted.values()):
        bad("totals", f"added {t['added']} != stored {count} + evicted {evicted}")


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
