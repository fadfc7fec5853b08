"""Eviction policies: age (the method's staleness bound) and capacity (a memory backstop only)."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .storage import RolloutStorage


class AgeEviction:
    """Select every stored rollout with age = step - birth_step > tau_max (tau_max None: never)."""

    def __init__(self, tau_max: Optional[int]):
        self.tau_max = tau_max

    def select(self, storage: RolloutStorage, step: int) -> np.ndarray:
        if self.tau_max is None or len(storage) == 0:
            return np.zeros(0, dtype=np.int64)
        too_old = storage.valid & (storage.col("birth_step") < step - self.tau_max)
        return np.flatnonzero(too_old)

    def state_dict(self) -> dict[str, Any]:
        return {}  # stateless: tau_max comes from the config

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class CapacityEviction:
    """Select the oldest insertions beyond `capacity`; at group granularity whole groups go together."""

    def __init__(self, capacity: Optional[int], whole_groups: bool):
        self.capacity = capacity
        self.whole_groups = whole_groups

    def select(self, storage: RolloutStorage) -> np.ndarray:
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

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
