"""Prioritized sampling over stored rollouts (or whole groups), from a seeded numpy generator.

Without replacement the target distribution is successive sampling: k items drawn one after another,
each with probability proportional to w among those not yet drawn. Two exact ways to draw it are used.

Gumbel-top-k in its exponential form (Efraimidis & Spirakis 2006): key_i = E_i / w_i with E_i ~ Exp(1),
the k smallest keys in order. One vectorised pass over every stored weight; used for group units, when k
is a large share of N, and to finish a tree draw. Keys are continuous, so ties have probability zero;
argsort is stable anyway, so a tie would resolve by slot order, never by comparing records.

At rollout granularity the sampler usually avoids touching every stored weight: it draws i.i.d. slots
from the storage's sum tree (O(log N) each) and keeps each slot's first occurrence, in order. That
sequence is exactly successive sampling without replacement (given the slots seen so far, the next new
slot is proportional to weight among the rest), the same distribution as Gumbel-top-k. If a few rounds
of i.i.d. draws do not yield k distinct slots (k close to N, or weight concentrated on few slots), the
rest is finished by Gumbel-top-k over the slots not yet drawn, which continues the same process exactly
(the i.i.d. stream is memoryless at the point where it is stopped).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .parts import BufferPart
from .storage import RolloutStorage


class Sampler(BufferPart):
    """A buffer part that chooses which stored rows to replay; it reads the storage and never changes it."""

    def sample(self, storage: RolloutStorage, n_rows: int, rng: np.random.Generator,
               weights: Optional[np.ndarray] = None) -> np.ndarray:
        """Slots (int64) of the drawn rows, in draw order. `weights` (one float64 per slot, e.g. the stored
        weights decayed by age: `ReplayConfig.age_decay`) replaces the stored weight column for this draw."""
        raise NotImplementedError


class PrioritizedSampler(Sampler):
    """Draws single rollouts with probability proportional to their stored weight (the storage's weight
    column and sum tree), without replacement within a call unless `replacement`. Stateless: the generator
    belongs to the buffer, which saves it."""

    # Use the tree from TREE_MIN_ROWS stored rows (512 rows without replacement, linear pass vs tree: 0.23 vs
    # 0.22 ms at 10k, 0.49 vs 0.28 ms at 32k, 1.8 vs 0.27 ms at 100k; below it the linear draw is kept, so
    # fixed-seed draws of smaller buffers stay what they were) while
    # k <= N / TREE_MAX_FRACTION (beyond, duplicates make i.i.d. rounds wasteful). MAX_ROUNDS bounds the
    # i.i.d. rounds before the Gumbel finish.
    TREE_MIN_ROWS = 32768
    TREE_MAX_FRACTION = 4
    MAX_ROUNDS = 4

    def __init__(self, replacement: bool = False):
        self.replacement = replacement

    def sample(self, storage: RolloutStorage, n_rows: int, rng: np.random.Generator,
               weights: Optional[np.ndarray] = None) -> np.ndarray:
        """Slots of exactly min(n_rows, stored) rows (n_rows with replacement; none from an empty storage).
        With `weights` the draw is one pass over them (the tree holds the stored weights)."""
        if n_rows <= 0 or len(storage) == 0:
            return np.zeros(0, dtype=np.int64)
        if weights is not None:
            slots = storage.valid_slots()
            return slots[self._draw(weights[slots], n_rows, rng)]
        if len(storage) >= self.TREE_MIN_ROWS and storage.tree.total > 0:
            if self.replacement:
                return self._tree_iid(storage, n_rows, rng)
            if n_rows * self.TREE_MAX_FRACTION <= len(storage):
                return self._tree_without_replacement(storage, n_rows, rng)
        w = storage.col("weight")[storage.valid]  # the stored weights in slot order: a mask gather beats an index one
        return storage.valid_slots()[self._draw(w, n_rows, rng)]

    def _tree_iid(self, storage: RolloutStorage, k: int, rng: np.random.Generator) -> np.ndarray:
        """k i.i.d. slots with probability proportional to weight."""
        tree, w = storage.tree, storage.col("weight")
        out = np.zeros(0, dtype=np.int64)
        while len(out) < k:
            s = tree.find(rng.random(k - len(out)) * tree.total)
            # Rounding can steer a target just past a subtree into a free slot: redraw those.
            out = np.concatenate([out, s[storage.valid[s] & (w[s] > 0)]])
        return out

    def _tree_without_replacement(self, storage: RolloutStorage, k: int, rng: np.random.Generator) -> np.ndarray:
        tree, valid, w = storage.tree, storage.valid, storage.col("weight")
        stream = np.zeros(0, dtype=np.int64)
        distinct = stream
        m = k + k // 8 + 8
        for _ in range(self.MAX_ROUNDS):
            s = tree.find(rng.random(m) * tree.total)
            stream = np.concatenate([stream, s[valid[s] & (w[s] > 0)]])
            _, first = np.unique(stream, return_index=True)
            distinct = stream[np.sort(first)]
            if len(distinct) >= k:
                return distinct[:k]
            m = 2 * (k - len(distinct)) + 8
        rest = storage.valid_slots()
        rest = rest[~np.isin(rest, distinct)]
        return np.concatenate([distinct, rest[self._draw(w[rest], k - len(distinct), rng)]])

    def _draw(self, w: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
        """Indices into w: k draws with probability proportional to w (without replacement: min(k, len(w)))."""
        if self.replacement:
            cdf = np.cumsum(w)
            return np.searchsorted(cdf, rng.random(k) * cdf[-1], side="right").clip(max=len(w) - 1)
        keys = rng.standard_exponential(len(w))
        keys /= w  # in place: one array of N keys, not two
        if k >= len(w):
            return np.argsort(keys, kind="stable")
        return smallest_keys(keys, k)


# Below this many keys, or above a PREFILTER_MAX_SHARE share of them drawn, `smallest_keys` partitions them all.
PREFILTER_MIN_KEYS = 2048
PREFILTER_MAX_SHARE = 1 / 8
_PREFILTER_STRIDE = 32


def smallest_keys(keys: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k smallest of `keys` (float64, no NaN among the k smallest), in ascending key order.

    A partition of every key costs ~13 ns a key; most keys are far above the k-th, so a bound from every
    32nd key (a quantile with a margin) keeps the few below it, which are sorted (512 of 10k fresh keys:
    129 -> 43 us, the sort numpy's default: 16 us where the stable one takes 37). The result
    is the same indices in the same order: the keys are continuous, so ties among finite keys have
    probability zero. When the bound keeps fewer than k keys, or is inf (zero weights: inf keys, which do
    tie), every key is partitioned as before."""
    n = len(keys)
    if n >= PREFILTER_MIN_KEYS and k <= n * PREFILTER_MAX_SHARE:
        sub = keys[::_PREFILTER_STRIDE]
        q = min(len(sub) - 1, int(len(sub) * k / n * 1.25) + 8)  # ~2.5 sd above the k-th key's quantile
        bound = np.partition(sub, q)[q]
        cand = (keys <= bound).nonzero()[0]
        if len(cand) >= k and bound < np.inf:
            return cand[np.argsort(keys[cand])[:k]]  # finite, distinct keys: any sort gives this order
    top = np.argpartition(keys, k - 1)[:k]
    return top[np.argsort(keys[top], kind="stable")]


class GroupPrioritizedSampler(PrioritizedSampler):
    """Draws whole groups (rows sharing a group key), a group's weight being the mean of its rows' weights
    (equal to each row's for group_std and uniform, which are constant within a group), never more than
    n_rows rows in all: groups come in draw order and each is taken only if it fits in the rows still
    missing (a group that does not fit is passed over, a smaller one after it may be taken), until none
    fits. So the count is n_rows exactly when the drawn groups' sizes add up to it (groups of G rows and
    n_rows a multiple of G), else less. Rows of a group come in slot order, groups in draw order."""

    def sample(self, storage: RolloutStorage, n_rows: int, rng: np.random.Generator,
               weights: Optional[np.ndarray] = None) -> np.ndarray:
        if n_rows <= 0 or len(storage) == 0:
            return np.zeros(0, dtype=np.int64)
        slots = storage.valid_slots()
        w = (storage.col("weight") if weights is None else weights)[slots]
        keys, inv, sizes = np.unique(storage.col("group_key")[slots], return_inverse=True, return_counts=True)
        unit_w = np.bincount(inv, weights=w) / sizes
        draw = self._units_iid if self.replacement else self._units_in_order
        by_unit = np.argsort(inv, kind="stable")
        starts = np.concatenate([[0], np.cumsum(sizes)])
        units = draw(unit_w, sizes, int(n_rows), rng)
        if not len(units):
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([slots[by_unit[starts[u] : starts[u + 1]]] for u in units])

    def _units_in_order(self, unit_w: np.ndarray, sizes: np.ndarray, room: int, rng: np.random.Generator) -> list[int]:
        """Without replacement: every group in draw order (one successive-sampling order), taken while it fits."""
        order = self._draw(unit_w, len(unit_w), rng)
        fits = np.cumsum(sizes[order]) <= room
        n_run = len(order) if fits.all() else int(np.argmin(fits))  # the leading run that fits as a whole
        taken = order[:n_run].tolist()
        room -= int(sizes[order[:n_run]].sum())
        smallest = int(sizes.min())
        for u in order[n_run:].tolist():  # past the first group that does not fit: skip, keep filling
            if room < smallest:
                break
            if sizes[u] <= room:
                taken.append(u)
                room -= int(sizes[u])
        return taken

    def _units_iid(self, unit_w: np.ndarray, sizes: np.ndarray, room: int, rng: np.random.Generator) -> list[int]:
        """With replacement: i.i.d. groups among those that fit the rows still missing, in rounds of as many
        draws as surely fit (each round takes at least one group, so the loop ends)."""
        taken: list[int] = []
        while True:
            fit = np.flatnonzero((sizes <= room) & (unit_w > 0))
            if not len(fit):
                return taken
            m = max(1, room // int(sizes[fit].max()))
            units = fit[self._draw(unit_w[fit], m, rng)]
            taken += units.tolist()
            room -= int(sizes[units].sum())
