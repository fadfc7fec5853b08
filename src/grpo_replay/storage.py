"""Slot storage for rollouts: scalar columns and padded token arenas, CPU, numpy.

Scalar fields live in columns indexed by slot. Token data lives in one preallocated arena per field, one
row per slot: int32 prompt ids right-aligned (left-padded with zeros); int32 completion ids, float32
behaviour log-probs and (when the rows carry them) float32 reference log-probs left-aligned; the
completion mask packed 8 positions to a byte (`np.packbits`, first position in the high bit), except for
rows whose mask is exactly their first comp_len positions (`dense`, the usual case): their mask is rebuilt
from comp_len and their mask arena row not written. An insert
is one copy of the batch per field, narrowed to that batch's own width, and a draw one row gather per
field (no unpad on insert, no re-pad on draw); the price is padding: each row takes the arena's width,
the longest row stored so far. Completion positions past a row's length (its last counted token) keep
what the fresh batch held there (padding, masked out like the fresh row's own) up to that batch's width,
and zeros beyond; they are not saved, so a loaded buffer has zeros there. Freed slots are reused LIFO. The
exact slot layout is part of `state_dict`, so a restored storage enumerates candidates in the same order
and a seeded sampler draws the same rows.

A sum tree over the slots' sampling weights (0 for free slots) lets the sampler draw in O(k log N) instead
of touching every stored weight. It is brought up to date when read (`tree`): add and remove only mark
their slots, so a slot freed and refilled between two reads is updated once, and nothing is updated while
the sampler does not use the tree (below its size threshold).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

# name -> dtype of the scalar columns kept per slot
COLUMNS: dict[str, Any] = {
    "birth_step": np.int64,
    "advantage": np.float32,
    "reward": np.float32,
    "group_std": np.float32,
    "group_key": np.int64,  # buffer-wide unique group id
    "prompt_key": np.int64,  # caller's stable prompt identity (-1 if none)
    "weight": np.float64,  # sampling weight, frozen at insertion like the advantage it derives from
    "seq": np.int64,  # insertion counter: the capacity backstop evicts the smallest first
    "uses": np.int64,  # times the row has been replayed (ReplayConfig.max_uses evicts at the limit)
    "prompt_len": np.int64,  # real prompt tokens (right-aligned in the prompt arena)
    "comp_len": np.int64,  # last counted completion position + 1
}
# Derived from the token arrays in the saved state, so not saved as columns (keeps the file format).
_LENGTH_COLUMNS = ("prompt_len", "comp_len")
# completion arenas: name -> dtype ("mask" holds packed bits: 8 completion positions a byte)
COMPLETION_FIELDS: dict[str, Any] = {"comp_ids": np.int32, "mask": np.uint8, "logps": np.float32, "ref": np.float32}


class StoredRow(NamedTuple):
    """One stored row unpadded (`RolloutStorage.tokens`); arrays are views into the arenas except `mask`."""

    prompt_ids: np.ndarray  # int32, the real prompt tokens
    completion_ids: np.ndarray  # int32, up to the last counted token
    logps: np.ndarray  # float32 behaviour log-probs
    mask: np.ndarray  # bool completion mask
    ref: Optional[np.ndarray]  # float32 reference log-probs, None when the rows carry none


class SumTree:
    """Complete binary tree of partial sums over `n` leaves (float64); node i = node 2i + node 2i+1."""

    def __init__(self, n: int):
        self.cap = 1 << max(0, int(n - 1).bit_length())
        self.t = np.zeros(2 * self.cap, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.t[1])

    def rebuild(self, leaves: np.ndarray) -> None:
        self.t[:] = 0.0
        self.t[self.cap : self.cap + len(leaves)] = leaves
        lo = self.cap // 2
        while lo >= 1:
            self.t[lo : 2 * lo] = self.t[2 * lo : 4 * lo : 2] + self.t[2 * lo + 1 : 4 * lo : 2]
            lo //= 2

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves idx (unique) to values and recompute their ancestors (each parent from its children,
        so the tree never accumulates rounding drift and equals a rebuild exactly)."""
        if len(idx) == 0:
            return
        idx = np.asarray(idx, dtype=np.int64)
        lo, hi = int(idx.min()), int(idx.max()) + 1
        if hi - lo == len(idx):  # a contiguous range (the usual case): ancestors are ranges too
            self.t[self.cap + lo : self.cap + hi][idx - lo] = values
            lo, hi = lo + self.cap, hi + self.cap
            while lo > 1:
                lo, hi = lo >> 1, ((hi - 1) >> 1) + 1
                self.t[lo:hi] = self.t[2 * lo : 2 * hi : 2] + self.t[2 * lo + 1 : 2 * hi : 2]
            return
        i = np.sort(idx) + self.cap
        self.t[i] = np.asarray(values, dtype=np.float64)[np.argsort(idx, kind="stable")]
        while i[0] > 1:
            i = i >> 1
            i = i[np.concatenate(([True], i[1:] != i[:-1]))]
            self.t[i] = self.t[2 * i] + self.t[2 * i + 1]

    def find(self, u: np.ndarray) -> np.ndarray:
        """Leaf index of each prefix-sum target u in [0, total): the first leaf whose cumulative sum exceeds u."""
        i = np.ones(len(u), dtype=np.int64)
        u = np.array(u, dtype=np.float64)
        while self.cap > 1 and i[0] < self.cap:
            left = self.t[2 * i]
            right = u >= left
            u -= np.where(right, left, 0.0)
            i = 2 * i + right
        return i - self.cap


class RolloutStorage:
    """Stored rollouts, one slot each: scalar columns (`COLUMNS`), token arenas and a sum tree of weights.

    Invariants: `valid[s]` marks an occupied slot and `len(self)` counts them; `_free` lists exactly the
    unoccupied slots (reused last-in first-out); every occupied slot has `prompt_len` real prompt tokens
    right-aligned in `prompt_ids` and `comp_len` completion positions (up to its last counted token)
    left-aligned in the completion arenas, its mask packed in the mask arena unless `dense[s]` (mask = the
    first comp_len positions); the tree that `tree` returns has leaf s = `weight[s]` for an occupied slot
    and 0 otherwise (leaves of slots marked in `_stale`, and their ancestors, may lag until then); `has_ref` says whether the stored rows carry reference log-probs (None when empty), and
    all stored rows agree on it.
    """

    def __init__(self, initial_slots: int = 1024):
        self._cols = {k: np.zeros(initial_slots, dtype=dt) for k, dt in COLUMNS.items()}
        self.valid = np.zeros(initial_slots, dtype=bool)
        self.dense = np.zeros(initial_slots, dtype=bool)
        self._free: list[int] = list(range(initial_slots - 1, -1, -1))  # pop() yields slot 0 first
        self._count = 0
        self._seq = 0
        self.prompt_ids = np.zeros((initial_slots, 0), dtype=np.int32)
        self.arena: dict[str, np.ndarray] = {k: np.zeros((initial_slots, 0), dt) for k, dt in COMPLETION_FIELDS.items()}
        self.width = 0  # completion positions of the widest arena (the ref arena may be narrower, the mask's packed)
        self.has_ref: Optional[bool] = None  # fixed by the first stored rows; reset when the storage empties
        self._tree = SumTree(initial_slots)
        self._stale = np.zeros(initial_slots, dtype=bool)  # slots whose leaf (and ancestors) await `tree`
        self._any_stale = False

    def __len__(self) -> int:
        return self._count

    def col(self, name: str) -> np.ndarray:
        return self._cols[name]

    def valid_slots(self) -> np.ndarray:
        return np.flatnonzero(self.valid)

    @property
    def tree(self) -> SumTree:
        """The sum tree, its stale leaves (slots added or removed since the last read) updated first."""
        if self._any_stale:
            idx = np.flatnonzero(self._stale)
            self._stale[idx] = False
            self._any_stale = False
            self._tree.set(idx, np.where(self.valid[idx], self._cols["weight"][idx], 0.0))
        return self._tree

    def _mark_stale(self, slots: np.ndarray) -> None:
        self._stale[slots] = True
        self._any_stale = True

    def _rebuild_tree(self) -> None:
        self._tree = SumTree(self.slots)
        self._tree.rebuild(np.where(self.valid, self._cols["weight"], 0.0))
        self._stale = np.zeros(self.slots, dtype=bool)
        self._any_stale = False

    @property
    def slots(self) -> int:
        return len(self.valid)

    def _grow(self, needed: int) -> None:
        old = self.slots
        new = max(old + old // 4, needed, 1)  # geometric (amortised O(1) a row), 25 % slack at most
        for k in self._cols:
            self._cols[k] = _resize_rows(self._cols[k], new)
        self.valid = _resize_rows(self.valid, new)
        self.dense = _resize_rows(self.dense, new)
        self.prompt_ids = _resize_rows(self.prompt_ids, new)
        self.arena = {k: _resize_rows(a, new) for k, a in self.arena.items()}
        self._free.extend(range(new - 1, old - 1, -1))
        self._rebuild_tree()

    def _widen(self, prompt_width: int, comp_width: int) -> None:
        """Grow the arenas to at least these widths (prompts stay right-aligned, completions left-aligned)."""
        P = self.prompt_ids.shape[1]
        if prompt_width > P:
            new = np.zeros((self.slots, prompt_width), np.int32)
            new[:, prompt_width - P :] = self.prompt_ids
            self.prompt_ids = new
        self.width = max(self.width, comp_width)
        for k, a in self.arena.items():
            W = _packed(comp_width) if k == "mask" else comp_width
            if W > a.shape[1] and (k != "ref" or self.has_ref):  # no reference log-probs: no ref arena
                new = np.zeros((self.slots, W), a.dtype)
                new[:, : a.shape[1]] = a
                self.arena[k] = new

    def add(
        self,
        scalars: dict[str, np.ndarray],
        prompt_ids: np.ndarray,
        completion: dict[str, Optional[np.ndarray]],
        prompt_mask: Optional[np.ndarray] = None,
    ) -> np.ndarray:
        """Store n rows; returns their slots.

        `scalars` maps every column except seq and uses (0 for a new row) to an array of length n; `prompt_ids` (n, P) of any integer
        dtype is left-padded (cast to int32 on the copy), with zeros unless `prompt_mask` (n, P) bool is
        given: positions where it is False are then stored as 0. `completion` maps comp_ids, logps and ref
        (None when the rows carry no reference log-probs) to right-padded (n, C) arrays of any dtype, cast on
        the copy, and mask to the packed mask of `pack_mask`, or to None when every row's mask is its first
        comp_len positions (`prefix_lengths`); comp_len in `scalars` comes from there."""
        n = len(prompt_ids)
        has_ref = completion.get("ref") is not None
        if self._count == 0:
            self.has_ref = has_ref
        elif has_ref != self.has_ref:
            raise ValueError(
                f"ReplayBuffer.add: ref_logps {'present' if has_ref else 'absent'} in this batch but "
                f"{'present' if self.has_ref else 'absent'} in the stored rows; all rows must agree"
            )
        if len(self._free) < n:
            self._grow(self._count + n)
        self._widen(prompt_ids.shape[1], completion["comp_ids"].shape[1])
        slots = np.array(self._free[len(self._free) - n :][::-1], dtype=np.int64)
        del self._free[len(self._free) - n :]
        rows = _Rows(slots)
        rows.put(self.prompt_ids, prompt_ids, left=True, keep=prompt_mask)
        dense = completion["mask"] is None
        if not dense:
            rows.put(self.arena["mask"], completion["mask"])
        for k in ("comp_ids", "logps", "ref"):
            if completion.get(k) is not None:
                rows.put(self.arena[k], completion[k])
        at = slice(rows.lo, rows.lo + n) if rows.run else slots  # a slice assigns faster than an index array
        for k, arr in scalars.items():
            self._cols[k][at] = arr
        self._cols["seq"][at] = np.arange(self._seq, self._seq + n)
        self._cols["uses"][at] = 0
        self._seq += n
        self.valid[at] = True
        self.dense[at] = dense
        self._count += n
        self._mark_stale(at)
        return slots

    def remove(self, slots: np.ndarray) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        if not self.valid[slots].all():
            raise KeyError("RolloutStorage.remove: slot not occupied")
        self.valid[slots] = False
        # Arena rows are left as they are: add overwrites a row's whole width before it is read again.
        # Reverse so that the lowest freed slot is reused first, keeping the layout compact and deterministic.
        self._free.extend(sorted(slots.tolist(), reverse=True))
        self._count -= len(slots)
        if self._count == 0:
            self.has_ref = None
        self._mark_stale(slots)

    def masks(self, slots: np.ndarray, width: int) -> np.ndarray:
        """(len(slots), width) bool completion masks of these slots: built from comp_len for dense rows,
        unpacked from the mask arena for the others."""
        clen, dense = self._cols["comp_len"][slots], self.dense[slots]
        if dense.all():
            return prefix_rows(clen, width)
        out = np.unpackbits(self.arena["mask"][slots, : _packed(width)], axis=1, count=width).view(np.bool_)
        if dense.any():
            out[dense] = prefix_rows(clen[dense], width)
        return out

    def tokens(self, slot: int) -> StoredRow:
        """One row unpadded; the arrays are views into the arenas, except the (unpacked) mask."""
        p, c = int(self._cols["prompt_len"][slot]), int(self._cols["comp_len"][slot])
        W = self.prompt_ids.shape[1]
        a = self.arena
        return StoredRow(
            prompt_ids=self.prompt_ids[slot, W - p :],
            completion_ids=a["comp_ids"][slot, :c],
            logps=a["logps"][slot, :c],
            mask=self.masks(np.array([slot]), c)[0],
            ref=a["ref"][slot, :c] if self.has_ref else None,
        )

    def nbytes(self) -> int:
        """Bytes held: columns, arenas (every allocated slot at the arena's width; the ref arena only once
        rows carry reference log-probs) and the sum tree."""
        arrays = [*self._cols.values(), self.valid, self.dense, self.prompt_ids, self._tree.t, self._stale, *self.arena.values()]
        return int(sum(a.nbytes for a in arrays))

    # --- persistence: plain arrays and ints only, no pickled objects -------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Token data unpadded and concatenated over the occupied slots in slot order (the format does not
        depend on the arena widths, nor on how the mask is packed)."""
        slots = self.valid_slots()
        plen, clen = self._cols["prompt_len"][slots], self._cols["comp_len"][slots]
        W = self.prompt_ids.shape[1]
        pkeep = prefix_rows(plen, W, right=True)

        def flat(k: str) -> np.ndarray:  # row-major order of the kept positions = concatenation order
            a = self.arena[k][slots] if k != "mask" else self.masks(slots, self.width)
            return a[prefix_rows(clen, a.shape[1])]

        has_ref = bool(self.has_ref) and len(slots) > 0
        # Free slots' column values are dead (never read): saved as zeros, so equal buffers save equal files.
        state: dict[str, Any] = {
            f"col.{k}": np.where(self.valid, v, 0).astype(v.dtype) for k, v in self._cols.items() if k not in _LENGTH_COLUMNS
        }
        state.update(
            valid=self.valid.copy(),
            free=np.asarray(self._free, dtype=np.int64),
            count=self._count,
            seq=self._seq,
            prompt_len=plen.astype(np.int64),
            comp_len=clen.astype(np.int64),
            prompt_ids=self.prompt_ids[slots][pkeep].astype(np.int32),
            comp_ids=flat("comp_ids").astype(np.int32),
            logps=flat("logps").astype(np.float32),
            mask=flat("mask").astype(np.bool_),
            has_ref=has_ref,
            ref=flat("ref").astype(np.float32) if has_ref else np.zeros(0, np.float32),
            # the arenas' allocated widths, so that a restored storage holds the same bytes as the saved one
            widths={"prompt_ids": W, **{k: int(a.shape[1]) for k, a in self.arena.items()}},
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict` output; the caller (ReplayBuffer.load) has validated it."""
        n_slots = len(state["valid"])
        self._cols = {k: np.zeros(n_slots, dt) for k, dt in COLUMNS.items()}
        self.valid = np.array(state["valid"], dtype=bool)
        for k, dt in COLUMNS.items():
            if k not in _LENGTH_COLUMNS:
                self._cols[k] = np.where(self.valid, np.asarray(state[f"col.{k}"], dtype=dt), 0).astype(dt)
        self._free = [int(x) for x in state["free"]]
        self._count = int(state["count"])
        self._seq = int(state["seq"])
        slots = self.valid_slots()
        plen = np.asarray(state["prompt_len"], np.int64)
        clen = np.asarray(state["comp_len"], np.int64)
        self._cols["prompt_len"][slots] = plen
        self._cols["comp_len"][slots] = clen
        P = int(plen.max()) if len(plen) else 0
        C = int(clen.max()) if len(clen) else 0
        # Saved widths (format 5 on) restore the arenas as allocated; older files: the widest stored row.
        widths = state.get("widths") or {"prompt_ids": P, "comp_ids": C, "logps": C, "mask": _packed(C),
                                          "ref": C if state["has_ref"] else 0}
        self.has_ref = bool(state["has_ref"]) if self._count else None
        self.prompt_ids = np.zeros((n_slots, widths["prompt_ids"]), np.int32)
        self.prompt_ids[slots] = _repad(state["prompt_ids"], plen, widths["prompt_ids"], np.int32, left=True)
        self.width = widths["comp_ids"]
        self.arena = {}
        for k, dt in COMPLETION_FIELDS.items():
            self.arena[k] = np.zeros((n_slots, widths[k]), dt)
            if k == "ref" and not self.has_ref:
                continue
            if k == "mask":
                m = _repad(state[k], clen, C, np.bool_, left=False)
                self.arena[k][slots, : _packed(C)] = np.packbits(m, axis=1)
                self.dense = np.zeros(n_slots, bool)
                self.dense[slots] = np.count_nonzero(m, axis=1) == clen
            else:
                self.arena[k][slots] = _repad(state[k], clen, widths[k], dt, left=False)
        self._rebuild_tree()


class _Rows:
    """Writes n rows into arenas at `slots`: through a view when the slots are one ascending run (the usual
    case with LIFO reuse), else through one block per arena. One copy per arena (cast on the copy, only
    the batch's own width), the rest of each row zeroed; no per-row work."""

    def __init__(self, slots: np.ndarray):
        self.slots, self.n = slots, len(slots)
        self.lo = int(slots[0]) if self.n else 0
        self.run = self.n > 0 and int(slots[-1]) - self.lo == self.n - 1 and bool((np.diff(slots) == 1).all())

    def put(self, arena: np.ndarray, src: np.ndarray, left: bool = False, keep: Optional[np.ndarray] = None) -> None:
        """`keep` (bool, src's shape): write 0 where it is False (a multiply: the zeroing costs no extra pass)."""
        W, w = arena.shape[1], src.shape[1]
        dst = arena[self.lo : self.lo + self.n] if self.run else np.empty((self.n, W), arena.dtype)
        if left:  # right-aligned
            dst[:, : W - w] = 0
            if keep is None:
                dst[:, W - w :] = src
            else:  # ids outside int32 sit only where keep is False (check_token_ids): they become 0
                np.multiply(src, keep, out=dst[:, W - w :], casting="unsafe")
        else:
            dst[:, :w] = src
            dst[:, w:] = 0
        if not self.run:
            arena[self.slots] = dst


def pack_mask(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(packed mask (n, ceil(C/8)) uint8, lengths (n,) int64) of an (n, C) mask of any dtype: an entry counts
    when it is nonzero; a row's length is its last counted position + 1."""
    mask = np.asarray(mask)
    packed = np.packbits(mask if mask.dtype == np.bool_ else mask != 0, axis=1)  # a bool mask packs as it is
    return packed, _packed_lengths(packed, mask.shape[1])


def prefix_lengths(mask: np.ndarray) -> Optional[np.ndarray]:
    """(n,) int64 lengths of an (n, C) bool mask whose every row is True exactly at its first positions,
    else None. Two cheap passes (a first-False search that stops early, one flat count) instead of packing."""
    n, C = mask.shape
    if n == 0 or C == 0:
        return np.zeros(n, np.int64)
    first_false = np.argmin(mask, axis=1)  # 0 also when a row is all True
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
    return stair[np.minimum(lengths, width)]


_STAIR = np.zeros(0, bool)


def _packed(width: int) -> int:
    """Bytes of a packed mask row of `width` positions."""
    return (width + 7) // 8


# _LAST_BIT[b]: 1 + the position (0 = high bit) of the last set bit of byte b; 0 for b = 0
_LAST_BIT = np.array([0] + [8 - ((b & -b).bit_length() - 1) for b in range(1, 256)], dtype=np.int64)


def _packed_lengths(packed: np.ndarray, width: int) -> np.ndarray:
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


def _resize_rows(a: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows,) + a.shape[1:], dtype=a.dtype)
    out[: len(a)] = a
    return out


def _repad(flat: np.ndarray, lengths: np.ndarray, width: int, dtype, left: bool) -> np.ndarray:
    """(len(lengths), width) array with each row's tokens from the concatenation `flat`, padded with zeros."""
    keep = prefix_rows(lengths, width, right=left)
    out = np.zeros(keep.shape, dtype)
    out[keep] = np.asarray(flat, dtype)
    return out
