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

from .. import metric_names as mn

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


class WeightedReward:
    """The training reward sum_k w_k f_k(text, problem) of `TrainConfig.reward_funcs` / `reward_weights`, each
    function scored through its own `RewardScorer` (a call that raises or times out scores that term 0 and is
    counted). `score_one` (the held-out evaluation, `SafeRewardTask`) scores the task's own reward, `correct`.

    A call returns (rewards, counts): counts holds reward/errors and reward/timeouts summed over the functions and,
    when the functions are logged, each function's sum over the rows (`SUM_KEY`), which `term_means` turns into
    the metrics row's rewards/<name>/mean (sums add up over dynamic sampling's rounds; means would not)."""

    SUM_KEY = "rewards/{name}/sum"

    def __init__(self, terms: Sequence[tuple[str, float, RewardScorer]], correct: RewardScorer, log_terms: bool):
        self.terms = list(terms)
        self.correct = correct
        self.log_terms = log_terms
        self._scorers = [correct, *(s for _, _, s in self.terms if s is not correct)]

    def __call__(self, texts: Sequence[str], problems: Sequence[object]) -> tuple[list[float], dict[str, float]]:
        total = [0.0] * len(texts)
        counts: dict[str, float] = {"reward/errors": 0, "reward/timeouts": 0}
        for name, weight, scorer in self.terms:
            values, c = scorer(texts, problems)
            total = [t + weight * v for t, v in zip(total, values)]
            counts["reward/errors"] += c["reward/errors"]
            counts["reward/timeouts"] += c["reward/timeouts"]
            if self.log_terms:
                counts[self.SUM_KEY.format(name=name)] = float(sum(values))
        return total, counts

    def score_one(self, text: str, problem: object) -> float:
        return self.correct.score_one(text, problem)

    @property
    def errors(self) -> int:
        return sum(s.errors for s in self._scorers)

    @property
    def timeouts(self) -> int:
        return sum(s.timeouts for s in self._scorers)

    def counts(self) -> dict[str, int]:
        return {"reward_errors": self.errors, "reward_timeouts": self.timeouts}

    def restore(self, counts: dict) -> None:
        """A resumed run's totals (one sum per kind in the checkpoint) go to the first scorer; the others restart."""
        self.correct.restore(counts)
        for s in self._scorers[1:]:
            s.restore({})


def term_means(counts: dict, n_rows: int) -> dict[str, float]:
    """`counts` with each function's row sum (`WeightedReward.SUM_KEY`) replaced by its mean over `n_rows`."""
    out = {}
    for k, v in counts.items():
        name = _term_name(k)
        out[k if name is None else mn.REWARD_FUNC_MEAN.format(name=name)] = v if name is None else v / max(n_rows, 1)
    return out


def _term_name(key: str) -> str | None:
    head, tail = WeightedReward.SUM_KEY.split("{name}")
    return key[len(head): -len(tail)] if key.startswith(head) and key.endswith(tail) else None


def training_reward(cfg, task) -> WeightedReward:
    """The run's `WeightedReward`: `cfg.reward_funcs` with `cfg.reward_weights` (default: the task's own reward,
    weight 1, which scores exactly as that reward alone)."""
    from ..tasks.reward_funcs import reward_functions

    funcs = reward_functions(cfg.reward, task)
    correct = RewardScorer(task.reward, cfg.reward_timeout)
    names = list(cfg.reward_funcs) or ["correct"]
    weights = list(cfg.reward_weights) or [1.0] * len(names)
    terms = [(n, float(w), correct if n == "correct" else RewardScorer(funcs[n], cfg.reward_timeout))
             for n, w in zip(names, weights)]
    return WeightedReward(terms, correct, log_terms=bool(cfg.reward_funcs))
