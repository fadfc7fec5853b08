"""A sum tree over per-slot sampling weights: O(log N) updates and prefix-sum searches (float64, exact)."""
from __future__ import annotations

from typing import Optional

import numpy as np


class SumTree:
    """Complete binary tree of partial sums over `n` leaves (float64); node i = node 2i + node 2i+1."""

    def __init__(self, n: int):
        self.cap = 1 << max(0, int(n - 1).bit_length())
        self.t = np.zeros(2 * self.cap, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.t[1])

    def rebuild(self, leaves: np.ndarray, keep: Optional[np.ndarray] = None) -> None:
        """Fill a new tree (all zeros) from its first len(leaves) leaves (0 where `keep`, bool, is False).
        Only those leaves and the nodes above them are written, in place: the rest stays 0, and the memory of
        a tree larger than its leaves is never touched."""
        n = len(leaves)
        self.t[self.cap : self.cap + n] = leaves
        if keep is not None:
            np.copyto(self.t[self.cap : self.cap + n], 0.0, where=~keep)
        lo, hi = self.cap, self.cap + max(n, 1)
        while lo > 1:
            lo, hi = lo >> 1, ((hi - 1) >> 1) + 1
            np.add(self.t[2 * lo : 2 * hi : 2], self.t[2 * lo + 1 : 2 * hi : 2], out=self.t[lo:hi])

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
