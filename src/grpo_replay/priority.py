"""Priority signals by name. One signature: (advantages, group_std, alpha, eps) -> weights.

All inputs are float arrays over stored rows (float32 or float64); the output is a float64 array of
non-negative sampling weights, P(i) = w_i / sum_j w_j.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .registry import Registry

PriorityFn = Callable[[np.ndarray, np.ndarray, float, float], np.ndarray]
PRIORITIES: Registry[PriorityFn] = Registry("priority")


@PRIORITIES.register("abs_advantage")
def abs_advantage(advantages: np.ndarray, group_std: np.ndarray, alpha: float, eps: float) -> np.ndarray:
    """The paper's rollout-level priority (|A_i| + eps)^alpha: the lone correct rollout of a group ranks high."""
    return np.power(np.abs(advantages, dtype=np.float64) + eps, alpha)


@PRIORITIES.register("group_std")
def group_std(advantages: np.ndarray, group_std: np.ndarray, alpha: float, eps: float) -> np.ndarray:
    """Query-level priority (sigma_g + eps)^alpha: every rollout of a group gets its group's weight."""
    return np.power(np.asarray(group_std, dtype=np.float64) + eps, alpha)


@PRIORITIES.register("uniform")
def uniform(advantages: np.ndarray, group_std: np.ndarray, alpha: float, eps: float) -> np.ndarray:
    return np.ones(len(advantages), dtype=np.float64)
