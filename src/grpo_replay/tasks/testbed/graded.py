"""Graded rewards of the testbed beside its exact-match reward: partial credit per answer digit and a format term.

Both read the completion as `TestbedTask.reward` does (`extract_answer`: the text after the last `]`, cut at the
first `<eos>`; with `require_eos`, a completion without `<eos>` scores 0). Combined with weights
(`TrainConfig.reward_funcs`, `reward_weights`) they make a reward whose groups are rarely all equal.
"""
from __future__ import annotations

from .task import TestbedProblem, extract_answer
from .tokenizer import EOS


def digit_credit(text: str, problem: TestbedProblem, require_eos: bool = False) -> float:
    """The share of digit positions right, aligned from the units: matches / max(len(answer), len(true sum)).

    "522" for 522 scores 1, "512" 2/3, "22" 2/3 (the hundreds are missing), "1522" 3/4; no well-formed answer
    scores 0. Leading zeros are dropped first ("0522" reads as 522)."""
    ans = _answer(text, require_eos)
    if ans is None:
        return 0.0
    got, true = str(int(ans)), str(int(problem.answer))
    matches = sum(a == b for a, b in zip(reversed(got), reversed(true)))
    return matches / max(len(got), len(true))


def format_credit(text: str, problem: TestbedProblem, require_eos: bool = False) -> float:
    """1.0 iff the completion ends in a well-formed answer (a decimal integer after an optional closed scratchpad),
    right or wrong."""
    return 0.0 if _answer(text, require_eos) is None else 1.0


def _answer(text: str, require_eos: bool) -> str | None:
    if require_eos and EOS not in text:
        return None
    return extract_answer(text)
