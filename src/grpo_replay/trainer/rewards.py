"""Scoring completions with a task's reward, robust to reward functions that raise or hang.

A reward that raises or exceeds its timeout scores 0 and is counted: one bad item must not kill a run,
but a silently failing reward would look like a hard task, so both counts go into the step metrics.
"""
from __future__ import annotations

import concurrent.futures as cf
from typing import Callable, Sequence


class RewardScorer:
    def __init__(self, reward_fn: Callable[[str, object], float], timeout: float):
        self.reward_fn = reward_fn
        self.timeout = timeout
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")
        self.errors = 0
        self.timeouts = 0

    def __call__(self, texts: Sequence[str], problems: Sequence[object]) -> tuple[list[float], dict[str, int]]:
        errors = timeouts = 0
        out = []
        for text, prob in zip(texts, problems):
            fut = self._pool.submit(self.reward_fn, text, prob)
            try:
                r = float(fut.result(timeout=self.timeout))
                if r != r or r in (float("inf"), float("-inf")):
                    raise ValueError(f"reward is {r}")
            except cf.TimeoutError:
                timeouts += 1
                r = 0.0
                # The hung call keeps its thread; start a fresh pool so later items are not queued behind it.
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")
            except Exception:
                errors += 1
                r = 0.0
            out.append(r)
        self.errors += errors
        self.timeouts += timeouts
        return out, {"reward/errors": errors, "reward/timeouts": timeouts}
