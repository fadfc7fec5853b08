"""uid relabelling for verl's prefix grouper (numpy only): verl's `_balance_batch` with `use_prefix_grouper` takes
runs of equal adjacent uids as groups and needs their number to divide by the DP size."""
from __future__ import annotations

import numpy as np


def adjacent_uid_order(uids: np.ndarray) -> np.ndarray:
    """Stable permutation that makes rows of one uid adjacent (groups in order of first appearance)."""
    _, first, inv = np.unique(np.asarray(uids).astype(str), return_index=True, return_inverse=True)
    return np.lexsort((np.arange(len(inv)), first[inv.reshape(-1)]))


def split_uid_runs(uids: np.ndarray, multiple: int, n_first: int = 0) -> np.ndarray:
    """Relabel runs of equal adjacent uids so that their number divides by `multiple`.

    verl's `_balance_batch` with `use_prefix_grouper` counts distinct uids and gives each DP rank as many; replay
    rows carry one uid per stored group, so that count is arbitrary. Single rows are peeled off the end of the
    largest runs into uids of their own, rows from index `n_first` on (the replay rows) first. Advantages are
    already computed, so a split group only shares its prompt prefix less. Always feasible when `len(uids)` is a
    multiple of `multiple` (every row its own uid is the limit)."""
    out = np.asarray(uids).astype(str).astype(object)
    n = len(out)
    starts = [i for i in range(n) if i == 0 or out[i] != out[i - 1]]
    runs = [[a, b] for a, b in zip(starts, starts[1:] + [n])]
    if len(set(out.tolist())) != len(runs):
        raise ValueError("split_uid_runs needs the rows of each uid to be adjacent (see adjacent_uid_order)")
    deficit = -len(runs) % int(multiple)
    if deficit > n - len(runs):
        raise ValueError(f"{n} rows cannot hold a multiple of {multiple} distinct uids")
    for k in range(deficit):
        # largest run, replay runs (start >= n_first) preferred
        run = max((r for r in runs if r[1] - r[0] > 1), key=lambda r: (r[0] >= n_first, r[1] - r[0], r[0]))
        run[1] -= 1
        out[run[1]] = f"{out[run[1]]}#split{k}"
        runs.append([run[1], run[1] + 1])
    return out
