"""Scoring completions with a task's reward, robust to reward functions that raise or hang.

A reward that raises, returns NaN/inf, or exceeds its timeout scores 0 and is counted: one bad item must not
kill a run, but a silently failing reward would look like a hard task, so both counts go into the step
metrics (`reward/errors`, `reward/timeouts`), the first few failures are logged with their cause, and the
run totals go into summary.json.

Calls run on a daemon worker thread. A call that times out is abandoned with its thread (Python cannot
kill a thread) and a fresh worker takes the next item; being a daemon, a hung thread never blocks exit.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import queue
import threading
from typing import Callable, Sequence

log = logging.getLogger("grpo_replay.trainer")
_LOGGED_PER_KIND = 3  # failures logged with their cause per scorer and kind; all are counted


class _Worker:
    """One daemon thread running submitted calls in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="reward", daemon=True).start()

    def _run(self) -> None:
        while True:
            fut, fn, args = self._jobs.get()
            if fut is None:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - reported through the future
                fut.set_exception(e)

    def submit(self, fn: Callable, *args) -> cf.Future:
        fut: cf.Future = cf.Future()
        self._jobs.put((fut, fn, args))
        return fut

    def stop(self) -> None:
        self._jobs.put((None, None, None))


class RewardScorer:
    def __init__(self, reward_fn: Callable[[str, object], float], timeout: float):
        self.reward_fn = reward_fn
        self.timeout = timeout
        self._worker = _Worker()
        self.errors = 0
        self.timeouts = 0
        self._logged = {"error": 0, "timeout": 0}

    def score_one(self, text: str, problem: object) -> float:
        """One reward; 0.0 (and counted in self.errors / self.timeouts) if it raises or times out."""
        r, kind = self._score(text, problem)
        if kind == "error":
            self.errors += 1
        elif kind == "timeout":
            self.timeouts += 1
        return r

    def __call__(self, texts: Sequence[str], problems: Sequence[object]) -> tuple[list[float], dict[str, int]]:
        errors = timeouts = 0
        out = []
        for text, prob in zip(texts, problems):
            r, kind = self._score(text, prob)
            errors += kind == "error"
            timeouts += kind == "timeout"
            out.append(r)
        self.errors += errors
        self.timeouts += timeouts
        return out, {"reward/errors": errors, "reward/timeouts": timeouts}

    def counts(self) -> dict[str, int]:
        """The run's totals so far, for a checkpoint (`restore` puts them back on resume, so a resumed run's
        summary counts the steps before the resume too)."""
        return {"reward_errors": self.errors, "reward_timeouts": self.timeouts}

    def restore(self, counts: dict) -> None:
        self.errors = int(counts.get("reward_errors", 0))
        self.timeouts = int(counts.get("reward_timeouts", 0))

    def _score(self, text: str, problem: object) -> tuple[float, str]:
        fut = self._worker.submit(self.reward_fn, text, problem)
        try:
            r = float(fut.result(timeout=self.timeout))
            if not math.isfinite(r):
                raise ValueError(f"reward is {r}")
            return r, ""
        except cf.TimeoutError:
            # The hung call keeps its thread; a fresh worker takes the next item.
            self._worker.stop()
            self._worker = _Worker()
            if self._log("timeout"):
                log.warning("reward function timed out after %ss; scored 0 (counted in reward/timeouts)", self.timeout)
            return 0.0, "timeout"
        except Exception as e:  # noqa: BLE001 - any failure of user code scores 0
            if self._log("error"):
                log.warning("reward function raised %s: %s; scored 0 (counted in reward/errors)", type(e).__name__, e)
            return 0.0, "error"

    def _log(self, kind: str) -> bool:
        self._logged[kind] += 1
        return self._logged[kind] <= _LOGGED_PER_KIND


class SafeRewardTask:
    """The task as `evaluate` sees it, with `reward` going through the scorer (timeout, errors scored 0)."""

    def __init__(self, task, scorer: RewardScorer):
        self._task, self._scorer = task, scorer

    def reward(self, text: str, problem) -> float:
        return self._scorer.score_one(text, problem)

    def __getattr__(self, name: str):
        return getattr(self._task, name)
