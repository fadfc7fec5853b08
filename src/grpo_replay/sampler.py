"""Prioritized sampling over stored rollouts (or whole groups), from a seeded numpy generator.

Without replacement the draw is Gumbel-top-k in its exponential form: key_i = E_i / w_i with E_i ~ Exp(1);
the k smallest keys are a sample of k items drawn one after another with probability proportional to w
among those not yet drawn (Efraimidis & Spirakis 2006). It costs one vectorised pass, no tree to maintain,
and the weights are frozen at insertion, so nothing is recomputed per draw. Keys are continuous, so ties
have probability zero; argsort is stable anyway, so a tie would resolve by slot order, never by comparing
records.
"""
from __future__ import annotations

import numpy as np

from .storage import RolloutStorage


class PrioritizedSampler:
    def __init__(self, replacement: bool = False, by_group: bool = False):
        self.replacement = replacement
        self.by_group = by_group

    def sample(self, storage: RolloutStorage, n_rows: int, rng: np.random.Generator) -> np.ndarray:
        """Slots of the drawn rows: exactly min(n_rows, stored) rows when sampling rollouts; when sampling
        groups, whole groups until at least n_rows rows (the last group may overshoot)."""
        slots = storage.valid_slots()
        if n_rows <= 0 or slots.size == 0:
            return np.zeros(0, dtype=np.int64)
        w = storage.col("weight")[slots]
        if not self.by_group:
            return slots[self._draw(w, n_rows, rng)]
        # Group units: a group's weight is the mean of its rows' weights (equal to each row's for
        # group_std and uniform, which are constant within a group).
        keys, inv, sizes = np.unique(storage.col("group_key")[slots], return_inverse=True, return_counts=True)
        unit_w = np.bincount(inv, weights=w) / sizes
        n_units = min(len(keys), int(np.ceil(n_rows / sizes.min()))) if not self.replacement else int(
            np.ceil(n_rows / sizes.min())
        )
        order = self._draw(unit_w, n_units, rng)
        take = int(np.searchsorted(np.cumsum(sizes[order]), n_rows) + 1)  # units needed to reach n_rows
        chosen = order[:take]
        # Rows of each chosen group, groups in draw order, rows in slot order within a group.
        by_unit = np.argsort(inv, kind="stable")
        starts = np.concatenate([[0], np.cumsum(sizes)])
        return np.concatenate([slots[by_unit[starts[u] : starts[u + 1]]] for u in chosen])

    def _draw(self, w: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
        """Indices into w: k draws with probability proportional to w (without replacement: min(k, len(w)))."""
        if self.replacement:
            cdf = np.cumsum(w)
            return np.searchsorted(cdf, rng.random(k) * cdf[-1], side="right").clip(max=len(w) - 1)
        keys = rng.standard_exponential(len(w)) / w
        if k >= len(w):
            return np.argsort(keys, kind="stable")
        top = np.argpartition(keys, k - 1)[:k]
        return top[np.argsort(keys[top], kind="stable")]  # in draw order

    def state_dict(self) -> dict:
        return {}  # the generator belongs to the buffer, which saves it

    def load_state_dict(self, state: dict) -> None:
        pass
