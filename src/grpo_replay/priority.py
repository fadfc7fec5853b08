"""Priority signals by name. One signature: (columns, config) -> weights.

`columns` maps a stored column name to a float or integer array over the rows being weighed: at least
advantage, reward, group_std, birth_step, group_key, prompt_key, prompt_len and comp_len (the columns of
`storage.COLUMNS` except weight and seq). `config` is the buffer's `ReplayConfig` (alpha, eps, ...). The
output is a float64 array of non-negative sampling weights, P(i) = w_i / sum_j w_j, frozen at insertion.
So a priority that needs the reward, the completion length or the birth step is one function here.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .registry import Registry

# `config` is the buffer's ReplayConfig; typed Any so that this module does not import config.py, which imports
# this registry to validate its priority names (an import cycle otherwise, if only for the type checker).
PriorityFn = Callable[[Mapping[str, np.ndarray], Any], np.ndarray]
PRIORITIES: Registry[PriorityFn] = Registry("priority", params=("columns", "config"))


@PRIORITIES.register("abs_advantage")
def abs_advantage(columns: Mapping[str, np.ndarray], config: Any) -> np.ndarray:
    """The paper's rollout-level priority (|A_i| + eps)^alpha: the lone correct rollout of a group ranks high."""
    return np.power(np.abs(columns["advantage"], dtype=np.float64) + config.eps, config.alpha)


@PRIORITIES.register("group_std")
def group_std(columns: Mapping[str, np.ndarray], config: Any) -> np.ndarray:
    """Query-level priority (sigma_g + eps)^alpha: every rollout of a group gets its group's weight."""
    return np.power(np.asarray(columns["group_std"], dtype=np.float64) + config.eps, config.alpha)


@PRIORITIES.register("uniform")
def uniform(columns: Mapping[str, np.ndarray], config: Any) -> np.ndarray:
    """Every rollout alike (weight 1)."""
    return np.ones(len(columns["advantage"]), dtype=np.float64)
