"""Eviction policies: age (the method's staleness bound) and capacity (a memory backstop only).

Every policy is an `Eviction`: `select(storage, step)` returns the slots to drop (it removes nothing itself;
the buffer does) and `state_dict`/`load_state_dict` save what the policy keeps beyond the config.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .parts import BufferPart
from .storage import RolloutStorage


class Eviction(BufferPart):
    """A buffer part that chooses stored rows to drop."""

    def select(self, storage: RolloutStorage, step: Optional[int]) -> np.ndarray:
        """Slots (int64, occupied, unique) to evict at optimizer step `step` (None: no step known)."""
        raise NotImplementedError


class AgeEviction(Eviction):
    """Selects every stored rollout with age = step - birth_step > tau_max (tau_max None: never). Stateless."""

    def __init__(self, tau_max: Optional[int]):
        self.tau_max = tau_max

    def select(self, storage: RolloutStorage, step: Optional[int]) -> np.ndarray:
        if self.tau_max is None or step is None or len(storage) == 0:
            return np.zeros(0, dtype=np.int64)
        return storage.born_before(step - self.tau_max)  # rows by birth step: O(rows evicted), not O(N)


class CapacityEviction(Eviction):
    """Selects the oldest insertions (by the storage's insertion counter) beyond `capacity` rows; with
    `whole_groups`, every row of a group with a selected row goes too. Stateless."""

    def __init__(self, capacity: Optional[int], whole_groups: bool = False):
        self.capacity = capacity
        self.whole_groups = whole_groups

    def select(self, storage: RolloutStorage, step: Optional[int] = None) -> np.ndarray:
        excess = len(storage) - (self.capacity if self.capacity is not None else len(storage))
        if excess <= 0:
            return np.zeros(0, dtype=np.int64)
        slots = storage.valid_slots()
        seq = storage.col("seq")[slots]
        oldest = slots[np.argpartition(seq, excess - 1)[:excess]]  # seq is unique: no ties to break
        if self.whole_groups:
            keys = storage.col("group_key")
            oldest = slots[np.isin(keys[slots], keys[oldest])]
        return oldest


__all__ = ["AgeEviction", "CapacityEviction", "Eviction"]
