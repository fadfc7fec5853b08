"""Unpadded completion storage: each row's real positions only, in flat arrays that several fields share.

`RaggedArena` keeps the rows of each insert as one run of positions, allocated from a ring: rows are evicted
mostly oldest first (by age, by capacity), so the space of the oldest runs is reused as they empty. A run is
reclaimed once every row in it is gone and every run older than it is too; a row freed earlier (a replay count
reached, a drift eviction) holds its positions until then, at most until its run ages out. When the ring has
no room for an insert it grows (by a quarter at least, with room for two such inserts) and the runs with rows
alive are copied to the front, in order.

A row's positions never wrap, so `row` returns a view; `gather` builds padded (n, width) arrays from any
slots, zeros past each row's length: for long rows a slice copy per row, for short ones one flat gather.

Simplifications: no compaction inside a run (a run's rows are freed together in the usual case: by age or
capacity; without either, a run keeps its positions while any of its rows is stored), and a field first given
after rows were stored reads zeros for those rows (the storage only reads it for rows that had it).

It answers the calls of `padded.PaddedArena`, so `RolloutStorage(unpadded=True)` holds one in its place.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Optional

import numpy as np

from .padding import RowWriter, one_allocation, packed_width, prefix_rows

# field -> dtype: one value per real completion position, the mask as bools
COMPLETION_FIELDS_UNPADDED: dict[str, Any] = {"comp_ids": np.int32, "mask": np.bool_, "logps": np.float32,
                                              "ref": np.float32}

LONG_ROWS = 64
"""Mean positions per row from which rows are copied one slice each (measured: at 1-2k positions a row the
slices take a quarter of the time of one boolean gather or selection; at 16 a row the Python loop costs more)."""


class RaggedArena:
    """Flat per-position arrays (`fields`) and, per slot, where its row starts (`start`) and in which run.

    Invariants: `_runs` maps each live run id to [begin, end, rows alive]; `_order` lists run ids oldest first,
    and the runs occupy disjoint position ranges in ring order: each starts at the previous one's end, or at
    0 after a wrap; an occupied slot's row lies within its run, at `start[slot]`, `length` positions long."""

    def __init__(self, slots: int, positions: int = 0):
        self.dtypes = {k: np.dtype(dt) for k, dt in COMPLETION_FIELDS_UNPADDED.items()}
        self.fields: dict[str, np.ndarray] = {}
        self.cap = positions
        self.start, self.run = _slot_block(slots)
        self._runs: dict[int, list[int]] = {}
        self._order: deque[int] = deque()
        self._next_run = 0
        self.width = 0  # completion positions of the widest row stored (what a padded arena would hold)

    # --- slots and space ------------------------------------------------------------------------------
    def resize_slots(self, slots: int) -> None:
        start, run = _slot_block(slots)
        start[: len(self.start)], run[: len(self.run)] = self.start, self.run
        self.start, self.run = start, run

    def _field(self, name: str) -> np.ndarray:
        if name not in self.fields:
            self.fields[name] = np.zeros(self.cap, self.dtypes[name])
        return self.fields[name]

    def _place(self, total: int) -> Optional[int]:
        """Where a run of `total` positions fits without touching a live run, or None."""
        if not self._order:
            return 0 if total <= self.cap else None
        oldest, newest = self._runs[self._order[0]], self._runs[self._order[-1]]
        tail, head = oldest[0], newest[1]
        if newest[0] >= oldest[0]:  # not wrapped: free at the end, then before the oldest run
            if self.cap - head >= total:
                return head
            return 0 if total <= tail else None
        return head if tail - head >= total else None  # wrapped: free between the newest and the oldest run

    def _grow(self, total: int) -> None:
        """Copy the runs with rows alive to the front of larger arrays, with room for two runs of `total`."""
        kept = [r for r in self._order if self._runs[r][2] > 0]
        live = sum(self._runs[r][1] - self._runs[r][0] for r in kept)
        cap = max(self.cap + self.cap // 4, live + 2 * total, 1024)  # geometric: amortised O(1) a position
        moved = one_allocation([(name, old.dtype, cap) for name, old in self.fields.items()])
        shift = np.zeros(self._next_run, np.int64)
        at = 0
        for r in kept:
            b, e, alive = self._runs[r]
            for name, old in self.fields.items():
                moved[name][at : at + e - b] = old[b:e]
            shift[r] = at - b
            self._runs[r] = [at, at + e - b, alive]
            at += e - b
        for r in self._order:
            if self._runs[r][2] == 0:
                del self._runs[r]
        self._order = deque(kept)
        self.fields, self.cap = moved, cap
        stored = self.run >= 0
        self.start[stored] += shift[self.run[stored]]  # freed slots' starts move too: never read

    # --- rows -----------------------------------------------------------------------------------------
    def widen(self, width: int, has_ref: bool) -> None:
        """Record the widest row (for the saved state's widths); the positions grow as rows come."""
        self.width = max(self.width, width)

    def put(self, rows: RowWriter, lengths: np.ndarray, completion: dict[str, Optional[np.ndarray]]) -> None:
        """Store `RolloutStorage.add`'s completion input at the writer's slots: each row's first lengths[i]
        positions, the mask unpacked to bools only when given (None: every row is dense, nothing to keep)."""
        fields = {k: completion.get(k) for k in ("comp_ids", "logps", "ref")}
        if completion["mask"] is not None:
            width = completion["comp_ids"].shape[1]
            fields["mask"] = np.unpackbits(completion["mask"], axis=1, count=width).view(np.bool_)
        self._put_run(rows.at, np.asarray(lengths, np.int64), fields)

    def _put_run(self, slots, lengths: np.ndarray, rows: dict[str, Optional[np.ndarray]], flat: bool = False) -> None:
        """Store rows at `slots` (a slice or int64 slots, in the order of `lengths`) as one run. `rows` maps a
        field to the rows padded on the right ((n, C) of any dtype, cast on the copy; each row's first
        lengths[i] positions are kept), or with `flat` to their values concatenated; None: not given."""
        total = int(lengths.sum())
        if total == 0:  # rows without positions belong to no run
            self.start[slots], self.run[slots] = 0, -1
            return
        p = self._place(total)
        if p is None:
            self._grow(total)
            p = self._place(total)
        offsets = np.cumsum(lengths) - lengths
        self.start[slots] = p + offsets
        rid = self._next_run
        self._next_run += 1
        self.run[slots] = rid
        self._runs[rid] = [p, p + total, len(lengths)]
        self._order.append(rid)
        keep = None
        for name, src in rows.items():
            if src is None:
                continue
            dst = self._field(name)[p : p + total]
            if flat:
                dst[:] = src
            elif total >= LONG_ROWS * len(lengths):  # long rows: one copy of their slices beats a selection
                np.concatenate([row[:n] for row, n in zip(src, lengths.tolist())], out=dst)
            else:
                keep = prefix_rows(lengths, src.shape[1]) if keep is None else keep
                dst[:] = src[keep]

    def release(self, slots: np.ndarray) -> None:
        """The rows at `slots` are gone: their runs are reclaimed once empty and oldest."""
        runs = self.run[slots]
        if len(runs) and runs[0] == runs[-1] and bool((runs == runs[0]).all()):  # the usual case: one run
            ids, counts = [int(runs[0])], [len(runs)]
        else:
            ids, counts = (a.tolist() for a in np.unique(runs, return_counts=True))
        for r, c in zip(ids, counts):
            if r >= 0:
                self._runs[r][2] -= c
        while self._order and self._runs[self._order[0]][2] == 0:
            del self._runs[self._order.popleft()]

    def _positions(self, slots: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """(sum(lengths),) int64: the rows' positions, concatenated in the order of `slots`."""
        total = int(lengths.sum())
        offsets = np.cumsum(lengths) - lengths
        return np.repeat(self.start[slots] - offsets, lengths) + np.arange(total)

    def gather(self, names: list[str], slots: np.ndarray, lengths: np.ndarray, width: int) -> dict[str, np.ndarray]:
        """(len(slots), width) arrays of the named fields, each row's positions first, zeros after."""
        n, total = len(slots), int(lengths.sum())
        out = {name: np.zeros((n, width), self.dtypes[name]) for name in names}
        given = [name for name in names if name in self.fields]
        if total >= LONG_ROWS * n:  # a copy per row (a slice each) beats one gather and scatter of every position
            starts, ls = self.start[slots].tolist(), lengths.tolist()
            for name in given:
                f, o = self.fields[name], out[name]
                for j, (s, m) in enumerate(zip(starts, ls)):
                    o[j, :m] = f[s : s + m]
        elif given:
            keep, at = prefix_rows(lengths, width), self._positions(slots, lengths)
            for name in given:
                out[name][keep] = self.fields[name][at]
        return out

    def flat(self, name: str, slots: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The rows' values of one field, concatenated (zeros for a field never given)."""
        if name not in self.fields:
            return np.zeros(int(lengths.sum()), self.dtypes[name])
        return self.fields[name][self._positions(slots, lengths)]

    def masks(self, slots: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
        """(len(slots), width) bool: the masks of these (not dense) rows, False past each row's length."""
        return self.gather(["mask"], slots, np.minimum(lengths, width), width)["mask"]

    def row(self, name: str, slot: int, length: int) -> np.ndarray:
        """One row's values of a field: a view (a field never given: zeros)."""
        s = int(self.start[slot])
        return self.fields[name][s : s + length] if name in self.fields else np.zeros(length, self.dtypes[name])

    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.fields.values()) + self.start.nbytes + self.run.nbytes)

    def saved_widths(self, has_ref: Optional[bool]) -> dict[str, int]:
        """The widths a padded arena would need for the rows seen (what the saved state records)."""
        w = self.width
        return {"comp_ids": w, "logps": w, "mask": packed_width(w), "ref": w if has_ref else 0}

    def load(self, state: dict[str, Any], slots: np.ndarray, lengths: np.ndarray, widths: dict[str, int],
             has_ref: Optional[bool]) -> np.ndarray:
        """Fill this (new) arena from a saved state's concatenated completions of the rows at `slots`, one run
        in slot order; returns which of those rows are dense."""
        self.width = widths["comp_ids"]
        mask = np.asarray(state["mask"], np.bool_)
        trues = np.concatenate(([0], np.cumsum(mask, dtype=np.int64)))
        ends = np.cumsum(lengths)
        dense = trues[ends] - trues[ends - lengths] == lengths
        self._put_run(slots, lengths, {"comp_ids": state["comp_ids"], "logps": state["logps"],
                                      "ref": state["ref"] if has_ref else None,
                                      "mask": None if dense.all() else mask}, flat=True)
        return dense


def _slot_block(slots: int) -> tuple[np.ndarray, np.ndarray]:
    """(start (slots,) int64 zeros, run (slots,) int32 of -1), in one allocation (`one_allocation`)."""
    views = one_allocation([("start", np.int64, slots), ("run", np.int32, slots)])
    views["run"][:] = -1
    return views["start"], views["run"]
