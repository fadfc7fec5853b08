"""Sums asked in words ("What is 43 + 17?"): a real-model task that a small instruct model solves some of the time.

Named data option `--data word_sums` (or `word_sums:D1,D2,...`: the operand digit counts mixed evenly; the
default `word_sums` is `word_sums:1,2`). SmolLM2-135M-Instruct (docs/models.md) gets one-digit sums right about
half the time and two-digit sums rarely (34/64 and 3/64 at temperature 0.6, top_p 0.95), so GRPO
groups have reward variance from the first step. The prompt is the bare question (no \\boxed{} instruction,
which a 135M model does not follow); the reward is math-verify on the completion's final answer (no box needed).

Training items come from one seeded stream and held-out items from another; one-digit pairs are only 100, so
the two sets share one-digit questions (held-out accuracy there measures the policy, not memorisation-free
generalisation).
"""
from __future__ import annotations

import random
from typing import Optional

from ..app.data import DataError, Problem

PREFIX = "word_sums"
TRAIN_ROWS = 4096
TRAIN_SEED, HELDOUT_SEED = 0, 1


def is_word_sums(spec: Optional[str]) -> bool:
    return bool(spec) and (spec == PREFIX or str(spec).startswith(PREFIX + ":"))


def parse_digits(spec: str) -> tuple[int, ...]:
    """`word_sums` -> (1, 2); `word_sums:1,2,3` -> (1, 2, 3). A DataError naming the allowed forms otherwise."""
    if spec == PREFIX:
        return (1, 2)
    text = spec[len(PREFIX) + 1 :]
    try:
        digits = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        digits = ()
    if not digits or any(not 1 <= d <= 9 for d in digits):
        raise DataError("TrainConfig.data", None, f"{spec!r} is invalid; allowed: word_sums or word_sums:D1,D2,... with digit counts 1-9")
    return digits


def word_sum_problems(spec: str, n: int, seed: int) -> list[Problem]:
    """`n` questions "What is a + b?", the operands' digit counts cycling through the spec's list."""
    digits = parse_digits(spec)
    rng = random.Random(seed)
    out = []
    for i in range(n):
        d = digits[i % len(digits)]
        lo = 0 if d == 1 else 10 ** (d - 1)
        a, b = rng.randint(lo, 10**d - 1), rng.randint(lo, 10**d - 1)
        out.append(Problem(id=f"sum{d}-{seed}-{i}", problem=f"What is {a} + {b}?", answer=str(a + b), source=PREFIX))
    return out


def difficulty(problem: Problem) -> int:
    """The operands' digit count of a generated item (its id is sum<D>-<seed>-<i>)."""
    return int(problem.id[3 : problem.id.index("-")])
