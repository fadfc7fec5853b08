"""Padded token rows, vectorised: completion masks packed to bits or, when they are a prefix, kept as lengths;
rows written into (and rebuilt from) fixed-width arenas. No per-row Python work anywhere."""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np


class RowWriter:
    """Writes n rows into arenas at `slots`: through views when the slots are at most `MAX_RUNS` ascending
    runs (the usual case with LIFO reuse: one run, or two where a growth of the storage left free slots at
    the end of the old ones), else through one block per arena. One copy per arena (cast on the copy, only
    the batch's own width), the rest of each row zeroed; no per-row work."""

    MAX_RUNS = 4

    def __init__(self, slots: np.ndarray):
        self.slots, self.n = slots, len(slots)
        self.lo = int(slots[0]) if self.n else 0
        # n distinct slots from lo to lo + n - 1, ascending, are exactly that run
        self.run = self.n > 0 and int(slots[-1]) - self.lo == self.n - 1 and bool(np.greater(slots[1:], slots[:-1]).all())
        self.runs: Optional[list[tuple[int, int, int]]] = [(0, self.n, self.lo)] if self.run else None
        # the slots as a slice when they are one run: a slice assigns faster than an index array
        self.at = slice(self.lo, self.lo + self.n) if self.run else slots
        if self.n and not self.run:
            cuts = np.flatnonzero(slots[1:] != slots[:-1] + 1) + 1  # distinct slots: a run is a step of +1
            if len(cuts) < self.MAX_RUNS:
                bounds = [0, *cuts.tolist(), self.n]
                self.runs = [(a, b, int(slots[a])) for a, b in zip(bounds[:-1], bounds[1:])]

    def put(self, arena: np.ndarray, src: np.ndarray, left: bool = False, keep: Optional[np.ndarray] = None) -> None:
        """`keep` (bool, src's shape): write 0 where it is False (a multiply: the zeroing costs no extra pass)."""
        if self.runs is None:
            block = np.empty((self.n, arena.shape[1]), arena.dtype)
            _fill(block, src, left, keep)
            arena[self.slots] = block
            return
        for a, b, lo in self.runs:
            _fill(arena[lo : lo + b - a], src[a:b], left, None if keep is None else keep[a:b])


def _fill(dst: np.ndarray, src: np.ndarray, left: bool, keep: Optional[np.ndarray]) -> None:
    """dst's rows = src's, right-aligned (`left` padding) or left-aligned, the rest zero."""
    W, w = dst.shape[1], src.shape[1]
    if left:
        if W > w:
            dst[:, : W - w] = 0
        if keep is None:
            dst[:, W - w :] = src
        else:  # ids outside int32 sit only where keep is False (check_token_ids): they become 0
            np.multiply(src, keep, out=dst[:, W - w :], casting="unsafe")
    else:
        dst[:, :w] = src
        if W > w:
            dst[:, w:] = 0


def pack_mask(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(packed mask (n, ceil(C/8)) uint8, lengths (n,) int64) of an (n, C) mask of any dtype: an entry counts
    when it is nonzero; a row's length is its last counted position + 1."""
    mask = np.asarray(mask)
    packed = np.packbits(mask if mask.dtype == np.bool_ else mask != 0, axis=1)  # a bool mask packs as it is
    return packed, packed_lengths(packed, mask.shape[1])


def prefix_lengths(mask: np.ndarray) -> Optional[np.ndarray]:
    """(n,) int64 lengths of an (n, C) bool mask whose every row is True exactly at its first positions,
    else None. Two cheap passes (a first-False search that stops early, one flat count) instead of packing."""
    n, C = mask.shape
    if n == 0 or C == 0:
        return np.zeros(n, np.int64)
    first_false = mask.argmin(axis=1)  # 0 also when a row is all True (methods: np.argmin's wrapper costs 1 us)
    lengths = np.where((first_false == 0) & mask[:, 0], C, first_false)
    # A row holds at least its prefix's Trues: equal totals mean no row has a True past its prefix.
    return lengths if np.count_nonzero(mask) == int(lengths.sum()) else None


def prefix_rows(lengths: np.ndarray, width: int, right: bool = False) -> np.ndarray:
    """(len(lengths), width) bool: row i True at its first lengths[i] positions (its last, if `right`).

    A row gather from a read-only "staircase" view (row k: k Trues) of one cached array: a copy per row,
    where a broadcast comparison costs several times more."""
    global _STAIR
    if width == 0:
        return np.zeros((len(lengths), 0), bool)
    base = _STAIR  # one read: another thread may replace it
    W = len(base) // 3
    if width > W:
        W = max(width, 2 * W)
        base = np.ones(3 * W, bool)
        base[W : 2 * W] = False
        base.flags.writeable = False
        _STAIR = base
    # _STAIR: W Trues, W Falses, W Trues. Row k starts at W - k (left: k Trues, then Falses) or at
    # 2W - width + k (right: width - k Falses, then k Trues); rows are read forwards, so each is one memcpy.
    offset, row_step = (W, -1) if not right else (2 * W - width, 1)
    stair = np.ndarray((width + 1, width), bool, buffer=base, offset=offset, strides=(row_step, 1))
    lengths = np.minimum(lengths, width)
    if width <= _SMALL_STAIR:  # narrow rows: `np.take` of a contiguous copy (a few KB) is 3x faster
        return np.take(np.ascontiguousarray(stair), lengths, axis=0)
    return stair[lengths]


_STAIR = np.zeros(0, bool)
_SMALL_STAIR = 64  # widths whose staircase (width + 1 rows) is copied contiguous for the gather


def packed_width(width: int) -> int:
    """Bytes of a packed mask row of `width` positions."""
    return (width + 7) // 8


# _LAST_BIT[b]: 1 + the position (0 = high bit) of the last set bit of byte b; 0 for b = 0
_LAST_BIT = np.array([0] + [8 - ((b & -b).bit_length() - 1) for b in range(1, 256)], dtype=np.int64)


def packed_lengths(packed: np.ndarray, width: int) -> np.ndarray:
    """(n,) int64: last set position + 1 of each packed mask row (0 for an all-zero row).

    Searched a word (8 bytes) at a time: the last nonzero word of each row, then its last nonzero byte,
    then that byte's last set bit; a byte-wise search costs as much as packing the mask."""
    n, nb = packed.shape
    if n == 0 or width == 0 or nb == 0:
        return np.zeros(n, np.int64)
    nw = -(-nb // 8)
    if nb % 8 or not packed.flags.c_contiguous:
        padded = np.zeros((n, 8 * nw), np.uint8)
        padded[:, :nb] = packed
        packed = padded
    rows = np.arange(n)
    nz = packed.view(np.uint64)[:, ::-1] != 0  # (n, nw), reversed: argmax finds the last nonzero word
    word = nw - 1 - np.argmax(nz, axis=1)
    last8 = packed.reshape(n, nw, 8)[rows, word]  # (n, 8) bytes of that word, in position order
    byte = 7 - np.argmax(last8[:, ::-1] != 0, axis=1)
    return np.where(nz.any(1), 8 * (8 * word + byte) + _LAST_BIT[last8[rows, byte]], 0)


def one_allocation(kinds: list[tuple[str, Any, int]]) -> dict[str, np.ndarray]:
    """name -> zeroed (count,) array of dtype, for each (name, dtype, count) of `kinds`, all views into one
    allocation (widest dtype first, so every view stays aligned): one large block is mapped by the allocator on
    its own and handed back to the system whole when it is replaced, where separate arrays of a few MB each
    would stay in its heap."""
    kinds = sorted(((k, np.dtype(dt), m) for k, dt, m in kinds), key=lambda k: -k[1].itemsize)
    block = np.zeros(sum(dt.itemsize * m for _, dt, m in kinds), np.uint8)
    views, at = {}, 0
    for k, dt, m in kinds:
        views[k] = block[at : at + dt.itemsize * m].view(dt)
        at += dt.itemsize * m
    return views


def row_gather(arena: np.ndarray, slots: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """arena[slots, lo:hi] as a new (len(slots), hi - lo) array: `np.take` of whole rows when the range is the
    arena's width (3-4x faster than an index-and-slice gather on narrow rows), else numpy's row gather of the
    column range (one copy; it beats torch.index_select on a column slice)."""
    if lo == 0 and hi == arena.shape[1]:
        return np.take(arena, slots, axis=0)
    return arena[slots, lo:hi]


def resize_rows(a: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows,) + a.shape[1:], dtype=a.dtype)
    out[: len(a)] = a
    return out


def repad(flat: np.ndarray, lengths: np.ndarray, width: int, dtype, left: bool) -> np.ndarray:
    """(len(lengths), width) array with each row's tokens from the concatenation `flat`, padded with zeros."""
    keep = prefix_rows(lengths, width, right=left)
    out = np.zeros(keep.shape, dtype)
    out[keep] = np.asarray(flat, dtype)
    return out


class EncodedRows(NamedTuple):
    """A fresh batch in the storage's input form (`encode_rows`), for `RolloutStorage.add`."""

    prompt_ids: np.ndarray  # (n, P') any integer dtype, real tokens right-aligned, P' the longest prompt
    prompt_mask: np.ndarray  # (n, P') bool: the real tokens (RolloutStorage.add zeroes the rest)
    prompt_len: np.ndarray  # (n,) int64
    comp_len: np.ndarray  # (n,) int64, last counted completion position + 1
    completion: dict[str, Optional[np.ndarray]]  # comp_ids, mask (packed or None), logps, ref: for RolloutStorage.add


def encode_rows(prompt_ids: np.ndarray, prompt_mask: np.ndarray, completion_ids: np.ndarray,
                completion_mask: np.ndarray, logps: np.ndarray, ref: Optional[np.ndarray]) -> EncodedRows:
    """A fresh padded batch ((n, P) prompts left-padded, (n, C) completions right-padded; masks of any dtype,
    nonzero = counted) as storage input, views of the arrays (no copy) where it can. The completion mask
    is packed to bits unless every row's mask is a prefix (then None: the storage rebuilds it from
    comp_len); prompts are compacted to their real tokens (a prompt mask is normally contiguous; interior
    zeros are squeezed out)."""
    pm = prompt_mask if prompt_mask.dtype == np.bool_ else prompt_mask != 0
    pid = prompt_ids
    n, P = pm.shape
    # Left-padded with one contiguous, non-empty run of real tokens in every row iff the count of real tokens
    # equals the sum over rows of P - (first real position), a row holding at most that many (an empty row
    # none, against P): one early-stopping search and one flat count.
    plen = P - pm.argmax(axis=1) if P else np.zeros(n, np.int64)
    if np.count_nonzero(pm) != int(plen.sum()):  # rare: empty prompts, or real tokens to move right, in order
        plen = np.count_nonzero(pm, axis=1).astype(np.int64)
        order = np.argsort(pm, axis=1, kind="stable")
        pid, pm = np.take_along_axis(pid, order, 1), prefix_rows(plen, P, right=True)
    Pw = int(plen.max()) if n else 0
    cm = completion_mask if completion_mask.dtype == np.bool_ else completion_mask != 0
    packed, comp_len = None, prefix_lengths(cm)
    if comp_len is None:
        packed, comp_len = pack_mask(cm)
    completion = {"comp_ids": completion_ids, "mask": packed, "logps": logps, "ref": ref}
    return EncodedRows(pid[:, P - Pw :], pm[:, P - Pw :], plen.astype(np.int64, copy=False), comp_len, completion)
