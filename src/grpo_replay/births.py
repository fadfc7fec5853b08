"""`BirthIndex`: stored rows listed by birth step, so that age eviction reads only the rows it evicts.

One entry per insert and birth step, in birth order (rows arrive in it; a late one is filed in its place): a
slice when the insert's slots are one ascending run (the usual case: no memory per row), else its int32 slots.
An entry may go on listing slots freed or refilled since; the storage's valid flags and birth column, passed
to each read, tell them apart.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np


class BirthIndex:
    """`entries`: (birth step, a slice or int32 slots), sorted by birth step; `steps`: their birth steps."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, Any]] = []
        self.steps: list[int] = []

    def before(self, step: int, valid: np.ndarray, births: np.ndarray) -> np.ndarray:
        """Sorted slots (int64) of the stored rows born before `step`: reads only the older entries (O(rows
        returned), plus the slots freed among them since)."""
        found = []
        for birth, at in self.entries:
            if birth >= step:
                break
            keep = valid[at] & (births[at] == birth)
            if isinstance(at, slice):  # all still there (the usual case): the range itself
                found.append(np.arange(at.start, at.stop) if keep.all() else np.flatnonzero(keep) + at.start)
            else:
                found.append(at[keep].astype(np.int64))
        if not found:
            return np.zeros(0, np.int64)
        if len(found) == 1:
            return found[0] if isinstance(self.entries[0][1], slice) else np.sort(found[0])
        # A slot freed and refilled by rows of the same birth step may be listed by two entries: count it once.
        return np.unique(np.concatenate(found))

    def file(self, at, births) -> None:
        """List new rows at `at` (a slice or slots): one entry per birth step among them, each in its place.
        `births`: the rows' birth steps, or one int for all."""
        if isinstance(births, (int, np.integer)):
            lo = hi = int(births)
        else:
            births = np.asarray(births)
            lo, hi = int(births.min()), int(births.max())
        if lo == hi:
            groups = [(lo, at if isinstance(at, slice) else at.astype(np.int32))]
        else:
            slots = np.arange(at.start, at.stop) if isinstance(at, slice) else at
            groups = [(int(b), slots[births == b].astype(np.int32)) for b in np.unique(births)]
        for b, s in groups:
            if not self.steps or b >= self.steps[-1]:
                self.entries.append((b, s))
                self.steps.append(b)
            else:  # a late row: filed among the rows of its birth step
                i = bisect_right(self.steps, b)
                self.entries.insert(i, (b, s))
                self.steps.insert(i, b)

    def drop_dead(self, valid: np.ndarray, births: np.ndarray) -> None:
        """Drop the oldest entries while none of their slots still holds a row of that birth step."""
        while self.entries:
            b, at = self.entries[0]
            first = at.start if isinstance(at, slice) else int(at[0])
            if valid[first] and births[first] == b:  # its first row is still there: no need to look further
                return
            if (valid[at] & (births[at] == b)).any():
                return
            del self.entries[0], self.steps[0]

    def rebuild(self, slots: np.ndarray, births: np.ndarray) -> None:
        """List the rows at `slots` (sorted), born at `births` (their birth steps), anew."""
        self.entries, self.steps = [], []
        if len(slots):
            self.file(slots, births)
