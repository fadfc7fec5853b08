"""Slot storage for rollouts: scalar columns, a prompt arena and a completion arena, CPU, numpy.

Scalar fields live in columns indexed by slot. Prompts live in one preallocated int32 arena, one row per slot,
right-aligned (left-padded with zeros). Completions live in one completion arena, chosen at construction:
padded (padded.py, the default: a row per slot and field, the mask packed to bits) or, with
`RolloutStorage(unpadded=True)`, without padding (ragged.py: each row's real positions only, gathered into
padded rows on a draw, zeros past each row's length). Both answer the same calls and give the same rows. A
row whose mask is exactly its first comp_len positions (`dense`, the usual case) has its mask rebuilt from
comp_len; the arena keeps only the others'. Freed slots are reused LIFO. The
exact slot layout is part of `state_dict`, so a restored storage enumerates candidates in the same order
and a seeded sampler draws the same rows.

A sum tree over the slots' sampling weights lets the sampler draw in O(k log N) instead of touching every
stored weight; its leaves are the weight column (0 for a free slot), so the weights are kept once. Its sums are
brought up to date when read (`tree`): add and remove only record their slots, so a read recomputes just the
sums above the leaves changed since the last one (a slot freed and refilled in between once), and nothing is
recomputed while the sampler does not use the tree (below its size threshold).

Rows are also listed by birth step (`BirthIndex`), so age eviction reads only the rows it evicts. The scalar columns, the free-slot stack and
the tree live in one allocation, so growing the storage hands the old one back to the system whole; the columns
that hold a default for every row unless the caller says otherwise (prompt keys, replay counts) are allocated
on first use. `encode_rows` (padding.py) turns a fresh batch's arrays into `add`'s input, and `rows` gives
padded rows back for slots: only this module, padding.py, padded.py and ragged.py know the arenas.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

from .births import BirthIndex
from .padded import PaddedArena
from .padding import (EncodedRows, RowWriter, encode_rows, one_allocation, pack_mask, packed_width, prefix_lengths,
                      prefix_rows, repad, resize_rows, row_gather)
from .ragged import RaggedArena
from .sumtree import SumTree
from .sumtree import nodes as tree_nodes

__all__ = ["COLUMNS", "SAVED_COLUMNS", "EncodedRows", "RolloutStorage", "StoredRow", "SumTree", "encode_rows",
           "pack_mask", "prefix_lengths", "prefix_rows"]

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
    "prompt_len": np.int32,  # real prompt tokens (right-aligned in the prompt arena)
    "comp_len": np.int32,  # last counted completion position + 1
}
# Columns holding this value in every row until a caller stores another: not allocated until then.
_LAZY_COLUMNS: dict[str, int] = {"prompt_key": -1, "uses": 0}
# Derived from the token arrays in the saved state, so not saved as columns (keeps the file format).
_LENGTH_COLUMNS = ("prompt_len", "comp_len")
# The saved columns and their dtypes in the file ("col.<name>").
SAVED_COLUMNS: dict[str, Any] = {k: dt for k, dt in COLUMNS.items() if k not in _LENGTH_COLUMNS}


class StoredRow(NamedTuple):
    """One stored row unpadded (`RolloutStorage.tokens`); arrays are views into the arenas except `mask`."""

    prompt_ids: np.ndarray  # int32, the real prompt tokens
    completion_ids: np.ndarray  # int32, up to the last counted token
    logps: np.ndarray  # float32 behaviour log-probs
    mask: np.ndarray  # bool completion mask
    ref: Optional[np.ndarray]  # float32 reference log-probs, None when the rows carry none


class RolloutStorage:
    """Stored rollouts, one slot each: scalar columns (`COLUMNS`), token arenas and a sum tree of weights.

    Invariants: `valid[s]` marks an occupied slot and `len(self)` counts them; `_free` lists exactly the
    unoccupied slots in `_free[:_n_free]` (a stack: reused last-in first-out); every occupied slot has
    `prompt_len` real prompt tokens right-aligned in `prompt_ids` and `comp_len` completion positions (up to
    its last counted token) in `completions`, its mask there too unless `dense[s]` (mask = the first comp_len
    positions); the weight column is the sum tree's leaves, 0 for a free slot, and the tree that `tree`
    returns sums them (the ancestors of the slots in `_changed` lag until then); every occupied slot is in
    the entry of `births` with its birth step;
    `has_ref` says whether the stored rows carry reference log-probs (None when empty), and all stored rows
    agree on it.
    """

    def __init__(self, initial_slots: int = 1024, unpadded: bool = False):
        """`unpadded`: completions keep only their real positions (`ragged.RaggedArena`), not a padded row each
        (`padded.PaddedArena`)."""
        self._cols, self.valid, self.dense, self._free, tree = _slot_columns(initial_slots)
        self._free[:] = np.arange(initial_slots - 1, -1, -1)  # the top (the end) is slot 0
        self._n_free = initial_slots
        self._count = 0
        self._seq = 0
        self.prompt_ids = np.zeros((initial_slots, 0), dtype=np.int32)
        self.completions: PaddedArena | RaggedArena = (RaggedArena if unpadded else PaddedArena)(initial_slots)
        self.has_ref: Optional[bool] = None  # fixed by the first stored rows; reset when the storage empties
        self._tree = SumTree(initial_slots, tree)
        self._changed: Optional[list] = []  # slots (arrays, slices) whose leaves await `tree`; None: rebuild it
        self._n_changed = 0
        self.births = BirthIndex()

    def __len__(self) -> int:
        return self._count

    @property
    def width(self) -> int:
        """Completion positions of the widest row the completion arena holds room for (saved as its width)."""
        return self.completions.width

    def col(self, name: str) -> np.ndarray:
        """The column over all slots (a view: writes go to the storage); a lazy column is allocated here."""
        if name not in self._cols and name in _LAZY_COLUMNS:
            self._cols[name] = np.full(self.slots, _LAZY_COLUMNS[name], COLUMNS[name])
        return self._cols[name]

    def _col_values(self, name: str) -> np.ndarray:
        """The column over all slots without allocating a lazy one (then a read-only array of its default)."""
        if name in self._cols:
            return self._cols[name]
        return np.broadcast_to(np.array(_LAZY_COLUMNS[name], COLUMNS[name]), (self.slots,))

    def valid_slots(self) -> np.ndarray:
        return self.valid.nonzero()[0]

    def keys(self) -> tuple[np.ndarray, np.ndarray]:
        """(insertion numbers, prompt keys) of the stored rows, (n,) int64 each, in slot order (copies)."""
        slots = self.valid_slots()
        return self._cols["seq"][slots].copy(), self._col_values("prompt_key")[slots].copy()

    @property
    def next_seq(self) -> int:
        """The insertion number the next stored row gets (rows are numbered 0, 1, ... over the storage's life;
        `reserve` hands numbers out ahead of the rows)."""
        return self._seq

    def reserve(self, n: int) -> np.ndarray:
        """(n,) int64: the next n insertion numbers, handed out now for rows an `add(seqs=...)` stores later."""
        out = np.arange(self._seq, self._seq + n, dtype=np.int64)
        self._seq += n
        return out

    def born_before(self, step: int) -> np.ndarray:
        """Sorted slots (int64) of the stored rows born before `step`, O(rows returned) (`BirthIndex`)."""
        return self.births.before(step, self.valid, self._cols["birth_step"])

    @property
    def tree(self) -> SumTree:
        """The sum tree, the leaves of the slots added or removed since the last read updated first."""
        if self._changed is None:
            self._rebuild_tree()
        elif self._changed:
            parts = [np.arange(p.start, p.stop) if isinstance(p, slice) else p for p in self._changed]
            idx = np.concatenate(parts) if len(parts) > 1 else parts[0]  # a slot listed twice is summed up once
            self._changed, self._n_changed = [], 0
            self._tree.refresh(idx)  # the leaves are the weight column, up to date already
        return self._tree

    def _mark_changed(self, slots) -> None:
        """Record slots (an array or a slice) whose leaves `tree` must update; past an eighth of the slots a
        rebuild costs less, and the record stops growing while nothing reads the tree."""
        if self._changed is None:
            return
        self._n_changed += (slots.stop - slots.start) if isinstance(slots, slice) else len(slots)
        if self._n_changed > max(1024, self.slots // 8):
            self._changed = None
        else:
            self._changed.append(slots)

    def _rebuild_tree(self) -> None:
        self._tree.rebuild(self._cols["weight"], keep=self.valid)
        self._changed, self._n_changed = [], 0

    def arena_widths(self) -> dict[str, int]:
        """Allocated width of each arena (prompt_ids and `padded.COMPLETION_FIELDS`, the mask's in packed bytes;
        unpadded: the widths a padded storage would need, what the saved format records)."""
        return {"prompt_ids": int(self.prompt_ids.shape[1]), **self.completions.saved_widths(self.has_ref)}

    @property
    def slots(self) -> int:
        return len(self.valid)

    def _grow(self, needed: int) -> None:
        old = self.slots
        new = max(old + old // 4, needed, 1)  # geometric (amortised O(1) a row), 25 % slack at most
        cols, valid, dense, free, tree = _slot_columns(new)
        for k, a in self._cols.items():
            if k in _LAZY_COLUMNS:
                cols[k] = np.full(new, _LAZY_COLUMNS[k], a.dtype)
            cols[k][:old] = a
        valid[:old], dense[:old] = self.valid, self.dense
        self._cols, self.valid, self.dense = cols, valid, dense
        self.prompt_ids = resize_rows(self.prompt_ids, new)
        self.completions.resize_slots(new)
        free[: self._n_free] = self._free[: self._n_free]
        free[self._n_free : self._n_free + new - old] = np.arange(new - 1, old - 1, -1)
        self._free, self._n_free = free, self._n_free + new - old
        self._tree = SumTree(new, tree)
        self._rebuild_tree()

    def _widen(self, prompt_width: int, comp_width: int) -> None:
        """Grow the arenas to at least these widths (prompts stay right-aligned, completions left-aligned)."""
        P = self.prompt_ids.shape[1]
        if prompt_width > P:
            new = np.zeros((self.slots, prompt_width), np.int32)
            new[:, prompt_width - P :] = self.prompt_ids
            self.prompt_ids = new
        self.completions.widen(comp_width, bool(self.has_ref))

    def add(
        self,
        scalars: dict[str, np.ndarray],
        prompt_ids: np.ndarray,
        completion: dict[str, Optional[np.ndarray]],
        prompt_mask: Optional[np.ndarray] = None,
        seqs: Optional[np.ndarray] = None,
    ) -> np.ndarray:
        """Store n rows; returns their slots.

        `scalars` maps every column except seq and uses (0 for a new row) to an array of length n, or to one
        value for all (birth_step: an int); prompt_key may be left out (-1 for every row). `prompt_ids`
        (n, P) of any integer dtype is left-padded (cast to int32 on the copy), with zeros unless `prompt_mask` (n, P) bool is
        given: positions where it is False are then stored as 0. `completion` maps comp_ids, logps and ref
        (None when the rows carry no reference log-probs) to right-padded (n, C) arrays of any dtype, cast on
        the copy, and mask to the packed mask of `pack_mask`, or to None when every row's mask is its first
        comp_len positions (`prefix_lengths`); comp_len in `scalars` comes from there. `seqs`: (n,) the rows'
        insertion numbers, reserved before (`reserve`); None: the next n."""
        n = len(prompt_ids)
        has_ref = completion.get("ref") is not None
        if self._count == 0:
            self.has_ref = has_ref
        elif has_ref != self.has_ref:
            raise ValueError(
                f"ReplayBuffer.add: ref_logps {'present' if has_ref else 'absent'} in this batch but "
                f"{'present' if self.has_ref else 'absent'} in the stored rows; all rows must agree"
            )
        if self._n_free < n:
            self._grow(self._count + n)
        self._widen(prompt_ids.shape[1], completion["comp_ids"].shape[1])
        self._n_free -= n
        slots = self._free[self._n_free : self._n_free + n][::-1].astype(np.int64)
        rows = RowWriter(slots)
        rows.put(self.prompt_ids, prompt_ids, left=True, keep=prompt_mask)
        dense = completion["mask"] is None
        at = rows.at
        self.completions.put(rows, scalars["comp_len"], completion)
        for k, arr in scalars.items():
            if k in self._cols:
                self._cols[k][at] = arr
            elif (np.asarray(arr) != _LAZY_COLUMNS[k]).any():  # a lazy column's first non-default value
                self.col(k)[at] = arr
        self._cols["seq"][at] = np.arange(self._seq, self._seq + n) if seqs is None else seqs
        for k, default in _LAZY_COLUMNS.items():  # allocated, not given: the default (uses: 0 for a new row)
            if k in self._cols and k not in scalars:
                self._cols[k][at] = default
        if seqs is None:
            self._seq += n
        self.valid[at] = True
        self.dense[at] = dense
        self._count += n
        self._mark_changed(at)
        self.births.file(at, scalars["birth_step"])
        return slots

    def remove(self, slots: np.ndarray) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        if not self.valid[slots].all():
            raise KeyError("RolloutStorage.remove: slot not occupied")
        self.valid[slots] = False
        self._cols["weight"][slots] = 0.0  # a free slot's leaf
        # Arena rows are left as they are: add overwrites a row's whole width before it is read again.
        # Reverse so that the lowest freed slot is reused first, keeping the layout compact and deterministic.
        self._free[self._n_free : self._n_free + len(slots)] = np.sort(slots)[::-1]
        self._n_free += len(slots)
        self._count -= len(slots)
        if self._count == 0:
            self.has_ref = None
        self._mark_changed(slots)
        self.births.drop_dead(self.valid, self._cols["birth_step"])
        self.completions.release(slots)

    def masks(self, slots: np.ndarray, width: int) -> np.ndarray:
        """(len(slots), width) bool completion masks of these slots: built from comp_len for dense rows,
        read from the completion arena for the others."""
        clen, dense = self._cols["comp_len"][slots], self.dense[slots]
        if dense.all():
            return prefix_rows(clen, width)
        out = self.completions.masks(slots, clen, width)
        if dense.any():
            out[dense] = prefix_rows(clen[dense], width)
        return out

    def rows(self, slots: np.ndarray) -> dict[str, Optional[np.ndarray]]:
        """The rows at `slots` (int64) as padded arrays keyed by `RolloutBatch` field (all but is_replay):
        prompt_ids (n, P) int32 and prompt_mask (n, P) bool left-padded, completion_ids (n, C) int32,
        completion_mask (n, C) bool, behaviour_logps and ref_logps (n, C) float32 (ref_logps None without
        reference log-probs) right-padded, P and C the longest among these rows; one row gather per arena
        (one flat gather per field when unpadded), no per-row work; then the scalar columns (n,)
        (advantages, rewards, group_ids, group_std, birth_step, buffer_seq)."""
        n = len(slots)
        plen, clen = self._cols["prompt_len"][slots], self._cols["comp_len"][slots]
        P = int(plen.max()) if n else 0
        C = int(clen.max()) if n else 0
        Wp = self.prompt_ids.shape[1]
        ref = bool(self.has_ref) and n > 0
        names = ["comp_ids", "logps"] + (["ref"] if ref else [])
        comp = self.completions.gather(names, slots, clen, C)
        col = self._cols
        return {
            "prompt_ids": row_gather(self.prompt_ids, slots, Wp - P, Wp),
            "prompt_mask": prefix_rows(plen, P, right=True),
            "completion_ids": comp["comp_ids"],
            "completion_mask": self.masks(slots, C),
            "behaviour_logps": comp["logps"],
            "advantages": col["advantage"][slots],
            "rewards": col["reward"][slots],
            "group_ids": col["group_key"][slots],
            "group_std": col["group_std"][slots],
            "birth_step": col["birth_step"][slots],
            "ref_logps": comp["ref"] if ref else None,
            "buffer_seq": col["seq"][slots],
        }

    def tokens(self, slot: int) -> StoredRow:
        """One row unpadded; the arrays are views into the arenas, except the (unpacked) mask."""
        p, c = int(self._cols["prompt_len"][slot]), int(self._cols["comp_len"][slot])
        W = self.prompt_ids.shape[1]
        comp = {k: self.completions.row(k, slot, c) for k in ("comp_ids", "logps", "ref")}
        return StoredRow(
            prompt_ids=self.prompt_ids[slot, W - p :],
            completion_ids=comp["comp_ids"],
            logps=comp["logps"],
            mask=self.masks(np.array([slot]), c)[0],
            ref=comp["ref"] if self.has_ref else None,
        )

    def nbytes(self) -> int:
        """Bytes held: columns, the free-slot stack, arenas (every allocated slot at the arena's width; the ref
        arena only once rows carry reference log-probs) and the sum tree."""
        cols = [a for k, a in self._cols.items() if k != "weight"]  # the weights are the tree's leaves
        arrays = [*cols, self.valid, self.dense, self._free, self.prompt_ids, self._tree.t]
        return int(sum(a.nbytes for a in arrays)) + self.completions.nbytes()

    # --- persistence: plain arrays and ints only, no pickled objects -------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Token data unpadded and concatenated over the occupied slots in slot order (the format does not
        depend on the arena widths, nor on how the mask is packed)."""
        slots = self.valid_slots()
        plen, clen = self._cols["prompt_len"][slots], self._cols["comp_len"][slots]
        W = self.prompt_ids.shape[1]
        pkeep = prefix_rows(plen, W, right=True)

        def flat(k: str) -> np.ndarray:  # row-major order of the kept positions = concatenation order
            if k != "mask":
                return self.completions.flat(k, slots, clen.astype(np.int64))
            return self.masks(slots, self.width)[prefix_rows(clen, self.width)]

        has_ref = bool(self.has_ref) and len(slots) > 0
        # Free slots' column values are dead (never read): saved as zeros, so equal buffers save equal files.
        state: dict[str, Any] = {
            f"col.{k}": np.where(self.valid, self._col_values(k), 0).astype(SAVED_COLUMNS[k]) for k in SAVED_COLUMNS
        }
        state.update(
            valid=self.valid.copy(),
            free=self._free[: self._n_free].astype(np.int64),
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
            widths=self.arena_widths(),
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict` output; the caller (ReplayBuffer.load) has validated it."""
        n_slots = len(state["valid"])
        self._cols, self.valid, self.dense, self._free, tree = _slot_columns(n_slots)
        self._tree = SumTree(n_slots, tree)
        self.valid[:] = state["valid"]
        for k, dt in SAVED_COLUMNS.items():
            v = np.where(self.valid, np.asarray(state[f"col.{k}"]), 0)
            if k not in _LAZY_COLUMNS:
                self._cols[k][:] = v
            elif (v[self.valid] != _LAZY_COLUMNS[k]).any():
                self.col(k)[:] = np.where(self.valid, v, _LAZY_COLUMNS[k])
        self._n_free = len(state["free"])
        self._free[: self._n_free] = state["free"]
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
        widths = state.get("widths") or {"prompt_ids": P, "comp_ids": C, "logps": C, "mask": packed_width(C),
                                          "ref": C if state["has_ref"] else 0}
        self.has_ref = bool(state["has_ref"]) if self._count else None
        self.prompt_ids = np.zeros((n_slots, widths["prompt_ids"]), np.int32)
        self.prompt_ids[slots] = repad(state["prompt_ids"], plen, widths["prompt_ids"], np.int32, left=True)
        self.completions = type(self.completions)(n_slots)
        self.dense[slots] = self.completions.load(state, slots, clen, widths, self.has_ref)
        self._rebuild_tree()
        self.births.rebuild(slots, self._cols["birth_step"][slots])


def _slot_columns(n: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(the eager `COLUMNS`, valid, dense, the free-slot stack (int32), the sum tree's nodes, whose leaves are
    the weight column) for n slots, zeros, as views into one allocation (`one_allocation`: handed back whole
    when the storage grows past it)."""
    kinds = [(k, dt, n) for k, dt in COLUMNS.items() if k not in _LAZY_COLUMNS and k != "weight"]
    kinds += [("free", np.int32, n), ("tree", np.float64, tree_nodes(n)), ("valid", bool, n),
              ("dense", bool, n)]
    views = one_allocation(kinds)
    tree = views.pop("tree")
    views["weight"] = tree[:n]  # the tree's leaves are the weight column
    return views, views.pop("valid"), views.pop("dense"), views.pop("free"), tree


