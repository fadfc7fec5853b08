"""Evaluation harness: grading, metrics (mean@n, pass@k, AES, length split), generation and reports.

The metric and grading functions import nothing heavy, so the trainer and the testbed can use them freely;
generation/runner/report pull in torch, transformers and matplotlib only when used.
"""
from .grading import DEFAULT_TIMEOUT, extract_boxed, grade, grade_many
from .metrics import aes, evaluate_correctness, length_split, mean_at_n, mean_pass_at_k, pass_at_k, relative_change

__all__ = [
    "DEFAULT_TIMEOUT",
    "aes",
    "evaluate_correctness",
    "extract_boxed",
    "grade",
    "grade_many",
    "length_split",
    "mean_at_n",
    "mean_pass_at_k",
    "pass_at_k",
    "relative_change",
]
