"""A sum tree over per-slot sampling weights: O(log N) updates and prefix-sum searches (float64, exact)."""
from __future__ import annotations

from typing import Optional

import numpy as np


class SumTree:
    """Complete binary tree of partial sums over `n` leaves (float64); node i = node 2i + node 2i+1."""

    def __init__(self, n: int, t: Optional[np.ndarray] = None):
        """`t`: the node array to use, 2 * `capacity(n)` float64 zeros (a view into a caller's allocation)."""
        self.cap = capacity(n)
        self.t = np.zeros(2 * self.cap, dtype=np.float64) if t is None else t

    @property
    def total(self) -> float:
        return float(self.t[1])

    def rebuild(self, leaves: np.ndarray, keep: Optional[np.ndarray] = None) -> None:
        """Fill the tree from its first len(leaves) leaves (0 where `keep`, bool, is False), the other leaves
        being 0 (a new tree, or one rebuilt before from no more leaves). Only those leaves and the nodes above
        them are written, in place: the rest stays 0, and the memory of a tree larger than its leaves is never
        touched."""
        n = len(leaves)
        self.t[self.cap : self.cap + n] = leaves
        if keep is not None:
            np.copyto(self.t[self.cap : self.cap + n], 0.0, where=~keep)
        lo, hi = self.cap, self.cap + max(n, 1)
        while lo > 1:
            lo, hi = lo >> 1, ((hi - 1) >> 1) + 1
            np.add(self.t[2 * lo : 2 * hi : 2], self.t[2 * lo + 1 : 2 * hi : 2], out=self.t[lo:hi])

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves idx (unique) to values and recompute their ancestors (`refresh`)."""
        idx = np.asarray(idx, dtype=np.int64)
        self.t[self.cap + idx] = values
        self.refresh(idx)

    def refresh(self, idx: np.ndarray) -> None:
        """Recompute the ancestors of leaves idx (unique, any order) from their children: each parent from
        its two children, so the tree never accumulates rounding drift and equals a rebuild exactly."""
        if len(idx) == 0:
            return
        idx = np.asarray(idx, dtype=np.int64)
        lo, hi = int(idx.min()), int(idx.max()) + 1
        if hi - lo == len(idx):  # a contiguous range (the usual case): ancestors are ranges too
            lo, hi = lo + self.cap, hi + self.cap
            while lo > 1:
                lo, hi = lo >> 1, ((hi - 1) >> 1) + 1
                np.add(self.t[2 * lo : 2 * hi : 2], self.t[2 * lo + 1 : 2 * hi : 2], out=self.t[lo:hi])
            return
        i = np.sort(idx) + self.cap
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


def capacity(n: int) -> int:
    """Leaves of the tree over n slots: the next power of two."""
    return 1 << max(0, int(n - 1).bit_length())
