"""Metric arithmetic: mean@n, unbiased pass@k, the Accuracy-Efficiency Score, completion-length splits.

Everything here is a pure function of counts and lengths, so the testbed, ``grpo-replay eval`` and
``grpo-replay compare`` share one definition of each number.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

CountPair = tuple[int, int]  # (n samples, c correct) for one problem


def _check_counts(n: int, c: int) -> None:
    if isinstance(n, bool) or isinstance(c, bool) or int(n) != n or int(c) != c:
        raise ValueError(f"n and c must be integers, got n={n!r}, c={c!r}")
    if n < 1:
        raise ValueError(f"n (samples per problem) must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c (correct samples) must satisfy 0 <= c <= n={n}, got {c}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Uses the numerically stable product form 1 - prod_{i=n-c+1}^{n} (1 - k/i) (Chen et al., 2021), which never
    forms the huge binomials. It depends only on (n, c, k), not on which samples were correct.

    Raises:
        ValueError: unless 1 <= k <= n and 0 <= c <= n (integers).
    """
    _check_counts(n, c)
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if k > n:
        raise ValueError(f"pass@k needs n >= k samples per problem, got n={n} < k={k}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_at_n(counts: Sequence[CountPair]) -> float:
    """The paper's accuracy: per-problem fraction correct c/n, averaged over problems (nan if none)."""
    if not counts:
        return float("nan")
    for n, c in counts:
        _check_counts(n, c)
    return sum(c / n for n, c in counts) / len(counts)


def mean_pass_at_k(counts: Sequence[CountPair], k: int) -> float:
    """pass@k averaged over problems (nan if there are none)."""
    if not counts:
        return float("nan")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def evaluate_correctness(counts: Sequence[CountPair], ks: Iterable[int] = (1,)) -> dict:
    """mean@n and pass@k over problems given per-problem (n, c) counts.

    Returns ``{"num_problems", "num_samples", "num_correct", "mean@n", "pass@k": {k: value}}``.
    ``pass@1`` equals ``mean@n``; it is reported anyway so curves start at k=1.
    """
    counts = [(int(n), int(c)) for n, c in counts]
    ks = sorted({int(k) for k in ks})
    return {
        "num_problems": len(counts),
        "num_samples": sum(n for n, _ in counts),
        "num_correct": sum(c for _, c in counts),
        "mean@n": mean_at_n(counts),
        "pass@k": {k: mean_pass_at_k(counts, k) for k in ks},
    }


def relative_change(value: Optional[float], base: Optional[float]) -> Optional[float]:
    """(value - base) / base, or None when either is missing or base is 0 (undefined)."""
    if value is None or base is None or base == 0 or _isnan(value) or _isnan(base):
        return None
    return (value - base) / base


def aes(
    acc: float,
    length: float,
    base_acc: float,
    base_length: float,
    alpha: float = 1.0,
    beta: float = 3.0,
    gamma: float = 5.0,
) -> float:
    """Accuracy-Efficiency Score relative to a baseline (the O1-Pruner form).

    dL = (L_base - L) / L_base (positive when shorter), dAcc = (Acc - Acc_base) / Acc_base;
    AES = alpha*dL + beta*|dAcc| if dAcc >= 0, else alpha*dL - gamma*|dAcc|.

    Raises:
        ValueError: when the baseline accuracy or length is 0 (the relative changes are undefined).
    """
    if base_acc == 0 or base_length == 0:
        raise ValueError(
            f"AES is undefined for a baseline with zero accuracy or length (base_acc={base_acc}, "
            f"base_length={base_length})"
        )
    d_len = (base_length - length) / base_length
    d_acc = (acc - base_acc) / base_acc
    if d_acc >= 0:
        return alpha * d_len + beta * abs(d_acc)
    return alpha * d_len - gamma * abs(d_acc)


def _mean(xs: Sequence[float]) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None


def _isnan(x: float) -> bool:
    return isinstance(x, float) and math.isnan(x)


def length_split(lengths: Sequence[int], correct: Sequence[bool]) -> dict:
    """Mean completion length (tokens) over all, correct and incorrect completions (None when a group is empty)."""
    if len(lengths) != len(correct):
        raise ValueError(f"lengths ({len(lengths)}) and correct ({len(correct)}) must have the same length")
    right = [float(l) for l, ok in zip(lengths, correct) if ok]
    wrong = [float(l) for l, ok in zip(lengths, correct) if not ok]
    return {
        "all": _mean([float(l) for l in lengths]),
        "correct": _mean(right),
        "incorrect": _mean(wrong),
        "num_correct": len(right),
        "num_incorrect": len(wrong),
    }
