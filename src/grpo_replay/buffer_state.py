"""A replay buffer's saved state: writing it, reading it back and validating every field.

`ReplayBuffer.save(path)` writes `<path>.npz` (the arrays, no pickled objects) and `<path>.json` (everything
else, with a SHA-256 checksum over both), the full name kept and the extensions appended, so
`buffer.step1` and `buffer.step2` never collide. Loading checks the checksum (files of version 1, written
before it existed, have none), then every field: presence, type, dtype, shape and value (finite advantages,
weights equal to the priority recomputed from them, birth steps not after the buffer's last step,
completion lengths that match the masks, a free list that is exactly the unused slots, ...). Every
problem raises `BufferStateError` naming the file and the field.
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

from .errors import UsageError
from .storage import SAVED_COLUMNS

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
SCALAR_KEYS = {"count", "seq", "has_ref"}
WIDTH_KEYS = ("prompt_ids", "comp_ids", "logps", "mask", "ref")  # storage_scalars.widths: arena -> allocated width
ARRAY_DTYPES: dict[str, Any] = {
    **{f"col.{k}": np.dtype(dt) for k, dt in SAVED_COLUMNS.items()},
    "valid": np.dtype(np.bool_),
    "free": np.dtype(np.int64),
    "prompt_len": np.dtype(np.int64),
    "comp_len": np.dtype(np.int64),
    "prompt_ids": np.dtype(np.int32),
    "comp_ids": np.dtype(np.int32),
    "logps": np.dtype(np.float32),
    "mask": np.dtype(np.bool_),
    "ref": np.dtype(np.float32),
}


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
    """(<path>.npz, <path>.json): the whole name kept, extensions appended (no with_suffix)."""
    p = os.fspath(path)
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
    if not (isinstance(value, dict) and set(value) == set(names) and all(_is_int(x) and x >= 0 for x in value.values())):
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
    for k in sorted(SCALAR_KEYS):
        if k not in st:
            bad(f"storage_scalars.{k}", "is missing")
    for k in sorted(set(st) - SCALAR_KEYS - {"widths"} - set(ARRAY_DTYPES)):
        bad(k, "is not a replay buffer state field", npz)
    _validate_columns(state, st, config, version, bad, npz)
    _validate_tokens(st, bad, npz)
    if version >= 5 or "widths" in st:
        _validate_widths(st, bad)


def _validate_header(state: Any, config, parts: dict[str, Any], bad) -> int:
    """The JSON side: version, keys, config, generator, parts, counters. Returns the version."""
    from .config import ReplayConfig

    version = state.get("version")
    if not _is_int(version) or version not in READABLE_VERSIONS:
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
    if not _is_int(state["next_group"]) or state["next_group"] < 0:
        bad("next_group", "must be an integer >= 0")
    try:
        totals(state["totals"], version)
    except ValueError as e:
        bad("totals", str(e))
    step = state.get("step")
    if step is not None and not _is_int(step):
        bad("step", "must be an integer or null")
    return version


def _validate_columns(state: dict, st: dict, config, version: int, bad, npz: str) -> None:
    """Storage scalars, array dtypes, the slot layout and the scalar columns of the stored rows."""
    from .priority import PRIORITIES

    count, seq, has_ref = st["count"], st["seq"], st["has_ref"]
    if not _is_int(count) or count < 0:
        bad("storage_scalars.count", "must be an integer >= 0")
    if not _is_int(seq) or seq < 0:
        bad("storage_scalars.seq", "must be an integer >= 0")
    if not isinstance(has_ref, (bool, np.bool_)):
        bad("storage_scalars.has_ref", "must be true or false")
    for k, dt in ARRAY_DTYPES.items():
        if k not in st:
            bad(k, "is missing", npz)
        a = st[k]
        if not isinstance(a, np.ndarray) or a.dtype != dt or a.ndim != 1:
            got = f"{a.dtype} with shape {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
            bad(k, f"must be a 1-D {dt} array, got {got}", npz)
    valid = st["valid"]
    S = len(valid)
    for k in ARRAY_DTYPES:
        if k.startswith("col.") and len(st[k]) != S:
            bad(k, f"has {len(st[k])} entries, 'valid' has {S} slots", npz)
    if int(valid.sum()) != count:
        bad("storage_scalars.count", f"is {count}, but {int(valid.sum())} slots are marked valid")
    free = st["free"]
    if len(free) != S - count or not np.array_equal(np.sort(free), np.flatnonzero(~valid)):
        bad("free", "must list each unused slot exactly once (no duplicates, no used or out-of-range slot)", npz)
    if bool(has_ref) and count == 0:
        bad("storage_scalars.has_ref", "is true for an empty buffer")
    col = {k[4:]: st[k][np.flatnonzero(valid)] for k in ARRAY_DTYPES if k.startswith("col.")}
    for k in ("advantage", "reward", "group_std"):
        if not np.isfinite(col[k]).all():
            bad(f"col.{k}", "holds NaN or inf in a stored row", npz)
    if (col["group_std"] < 0).any():
        bad("col.group_std", "holds a negative group standard deviation", npz)
    for k in ("prompt_len", "comp_len"):
        if len(st[k]) != count:
            bad(k, f"has {len(st[k])} entries for {count} stored rows", npz)
        if (st[k] < 0).any():
            bad(k, "holds a negative length", npz)
    expected = PRIORITIES.get(config.priority)({**col, "prompt_len": st["prompt_len"], "comp_len": st["comp_len"]}, config)
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
    if (col["prompt_key"] < -1).any():
        bad("col.prompt_key", "must be >= -1 (-1: no prompt key)", npz)
    if (col["seq"] < 0).any() or (col["seq"] >= seq).any() or len(np.unique(col["seq"])) != count:
        bad("col.seq", f"must be distinct insertion numbers in [0, seq={seq})", npz)
    # A row replayed max_uses times is evicted by that draw: no stored row has reached the limit.
    limit = config.max_uses
    if (col["uses"] < 0).any() or (limit is not None and (col["uses"] >= limit).any()):
        bad("col.uses", "must be replay counts >= 0" + (f" and < max_uses={limit}" if limit is not None else ""), npz)
    t = totals(state["totals"], version)
    evicted = {k: v for k, v in t.items() if k != "added"}
    if t["added"] != count + sum(evicted.values()):
        bad("totals", f"added {t['added']} != stored {count} + evicted {evicted}")


def _validate_tokens(st: dict, bad, npz: str) -> None:
    """The concatenated token arrays against the lengths and masks."""
    plen, clen, has_ref = st["prompt_len"], st["comp_len"], st["has_ref"]
    n_tok = len(st["comp_ids"])
    for k in ("logps", "mask") + (("ref",) if has_ref else ()):
        if len(st[k]) != n_tok:
            bad(k, f"has {len(st[k])} entries, 'comp_ids' has {n_tok}", npz)
    if not has_ref and len(st["ref"]):
        bad("ref", "must be empty when storage_scalars.has_ref is false", npz)
    for k, lens, tokens in (("prompt_len", plen, "prompt_ids"), ("comp_len", clen, "comp_ids")):
        if int(lens.sum()) != len(st[tokens]):
            bad(k, f"adds up to {int(lens.sum())} tokens, but '{tokens}' holds {len(st[tokens])}", npz)
    if (st["prompt_ids"] < 0).any() or (st["comp_ids"] < 0).any():
        bad("prompt_ids" if (st["prompt_ids"] < 0).any() else "comp_ids", "holds a negative token id", npz)
    ends = np.cumsum(clen)[clen > 0] - 1
    if not st["mask"][ends].all():
        bad("comp_len", "does not match 'mask': a completion length must end at a counted token", npz)
    m = st["mask"]
    if not np.isfinite(st["logps"][m]).all():
        bad("logps", "holds NaN or inf at a counted token", npz)
    if has_ref and not np.isfinite(st["ref"][m]).all():
        bad("ref", "holds NaN or inf at a counted token", npz)


def _validate_widths(st: dict, bad) -> None:
    """The arenas' allocated widths: each at least what the stored rows need."""
    w = st.get("widths")
    if not isinstance(w, dict) or sorted(w) != sorted(WIDTH_KEYS) or not all(_is_int(v) and v >= 0 for v in w.values()):
        bad("storage_scalars.widths", f"must map {', '.join(WIDTH_KEYS)} to integers >= 0")
    P = int(st["prompt_len"].max()) if len(st["prompt_len"]) else 0
    C = int(st["comp_len"].max()) if len(st["comp_len"]) else 0
    need = {"prompt_ids": P, "comp_ids": C, "logps": C, "mask": (C + 7) // 8, "ref": C if st["has_ref"] else 0}
    for k, n in need.items():
        if w[k] < n:
            bad(f"storage_scalars.widths.{k}", f"is {w[k]}, narrower than the stored rows need ({n})")
    if w["comp_ids"] != w["logps"]:
        bad("storage_scalars.widths", "must give comp_ids and logps the same width")


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
