"""A saved `RolloutStorage` state (`RolloutStorage.state_dict`): its fields, and the checks that it is one
`load_state_dict` restores into a consistent storage.

The state holds the scalar columns over every slot ("col.<name>", `SAVED_COLUMNS`), the slot layout (valid,
free), the stored rows' lengths and their tokens concatenated in slot order (one format for the padded and the
unpadded completion arena), the scalars count, seq and has_ref, and the arenas' allocated widths. `check`
judges all of that; the rules that tie the rows to a buffer's config and counters (weights equal to the
priority, birth steps, group ids, replay counts, totals) are the buffer's (buffer_state.py).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .padding import packed_width
from .storage import SAVED_COLUMNS

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
# bad(field, problem, file=<the JSON file>) raises; array fields name the npz file
Bad = Callable[..., None]


def check(st: dict, bad: Bad, npz: str, widths_required: bool) -> dict[str, np.ndarray]:
    """Raise through `bad` unless `st` is a loadable storage state; the saved widths are checked when present
    and required when `widths_required`. Returns the stored rows' columns (name without "col." -> the values
    of the valid slots, in slot order) with their prompt_len and comp_len."""
    for k in sorted(SCALAR_KEYS):
        if k not in st:
            bad(f"storage_scalars.{k}", "is missing")
    for k in sorted(set(st) - SCALAR_KEYS - {"widths"} - set(ARRAY_DTYPES)):
        bad(k, "is not a replay buffer state field", npz)
    col = _check_columns(st, bad, npz)
    _check_tokens(st, bad, npz)
    if widths_required or "widths" in st:
        _check_widths(st, bad)
    return {**col, "prompt_len": st["prompt_len"], "comp_len": st["comp_len"]}


def _check_columns(st: dict, bad: Bad, npz: str) -> dict[str, np.ndarray]:
    """Storage scalars, array dtypes, the slot layout and the scalar columns of the stored rows."""
    count, seq, has_ref = st["count"], st["seq"], st["has_ref"]
    if not is_integer(count) or count < 0:
        bad("storage_scalars.count", "must be an integer >= 0")
    if not is_integer(seq) or seq < 0:
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
    if (col["prompt_key"] < -1).any():
        bad("col.prompt_key", "must be >= -1 (-1: no prompt key)", npz)
    if (col["seq"] < 0).any() or (col["seq"] >= seq).any() or len(np.unique(col["seq"])) != count:
        bad("col.seq", f"must be distinct insertion numbers in [0, seq={seq})", npz)
    return col


def _check_tokens(st: dict, bad: Bad, npz: str) -> None:
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


def _check_widths(st: dict, bad: Bad) -> None:
    """The arenas' allocated widths: each at least what the stored rows need."""
    w = st.get("widths")
    if not isinstance(w, dict) or sorted(w) != sorted(WIDTH_KEYS) or not all(is_integer(v) and v >= 0 for v in w.values()):
        bad("storage_scalars.widths", f"must map {', '.join(WIDTH_KEYS)} to integers >= 0")
    P = int(st["prompt_len"].max()) if len(st["prompt_len"]) else 0
    C = int(st["comp_len"].max()) if len(st["comp_len"]) else 0
    need = {"prompt_ids": P, "comp_ids": C, "logps": C, "mask": packed_width(C), "ref": C if st["has_ref"] else 0}
    for k, n in need.items():
        if w[k] < n:
            bad(f"storage_scalars.widths.{k}", f"is {w[k]}, narrower than the stored rows need ({n})")
    if w["comp_ids"] != w["logps"]:
        bad("storage_scalars.widths", "must give comp_ids and logps the same width")


def is_integer(x: Any) -> bool:
    """An int or a numpy integer, not a bool (a state read from JSON holds ints, one kept in memory may not)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
