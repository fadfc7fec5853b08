"""Answer grading with math-verify: last ``\\boxed{}`` of a completion vs the gold answer.

Timeouts. math-verify bounds each parse/compare with ``signal.alarm``, which only works on the main thread of
the main interpreter (it raises ValueError elsewhere). We therefore switch its timeouts off
(``parsing_timeout=None``, ``timeout_seconds=None``) and enforce one overall budget per grade ourselves:

* on the main thread: a ``setitimer`` alarm that raises :class:`GradeTimeout` (a ``BaseException``, so the
  ``except Exception`` blocks inside math-verify/sympy cannot swallow it); an outer alarm (e.g. pytest-timeout)
  is saved and re-armed afterwards;
* off the main thread: the grade runs in a persistent worker process (on *its* main thread, so with the alarm),
  and the caller waits with a hard deadline; a worker stuck in C code past the deadline is killed and replaced.

A timeout, like any parse failure, grades False. :func:`grade_many` spreads a batch over worker processes
with the same hard deadlines.
"""
from __future__ import annotations

import logging
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import wait as mp_wait
from typing import Optional, Sequence

from ..app.answers import extract_boxed

DEFAULT_TIMEOUT = 5.0
"""Seconds allowed for one grade (parsing both answers and comparing them)."""
_HARD_GRACE = 5.0  # extra seconds a worker process gets beyond `timeout` before it is killed
_STARTUP_ALLOWANCE = 60.0  # a freshly spawned worker must import math-verify/sympy before its first grade


class GradeTimeout(BaseException):
    """Raised by the grading alarm; BaseException so library ``except Exception`` blocks let it through."""


class _DropTimeoutDisabledWarning(logging.Filter):
    # math-verify warns once that its own timeout is off; we deliberately replaced it with ours.
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


# ----------------------------------------------------------------------------------------------------------
# One grade


def _grade_unprotected(completion: str, gold: str, require_boxed: bool) -> bool:
    """The grading logic itself, with math-verify's signal timeouts disabled (callers add the timeout)."""
    from math_verify import parse, verify

    answer = extract_boxed(completion)
    if answer is None:
        if require_boxed:
            return False
        target = parse(completion, parsing_timeout=None)
    else:
        if not answer:
            return False
        target = parse("\\boxed{" + answer + "}", parsing_timeout=None)
    gold_parsed = parse("\\boxed{" + str(gold) + "}", parsing_timeout=None)
    if not gold_parsed or not target:
        return False
    # verify(gold, target) is not symmetric: gold first (e.g. "x=5" as a prediction matches gold "5").
    return bool(verify(gold_parsed, target, timeout_seconds=None))


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")


def _grade_with_alarm(completion: str, gold: str, timeout: Optional[float], require_boxed: bool) -> bool:
    """Main-thread path: one setitimer alarm around the whole grade; any outer alarm is restored."""
    if timeout is None or timeout <= 0:
        return _safe(completion, gold, require_boxed)

    def on_alarm(signum, frame):
        raise GradeTimeout()

    started = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return _safe(completion, gold, require_boxed)
    except GradeTimeout:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:  # re-arm the outer timer with what is left of it (fire now if already due)
            remaining = max(old_delay - (time.monotonic() - started), 1e-6)
            signal.setitimer(signal.ITIMER_REAL, remaining, old_interval)


def _safe(completion: str, gold: str, require_boxed: bool) -> bool:
    try:
        return _grade_unprotected(completion, gold, require_boxed)
    except Exception:  # a parser crash on odd model output is a wrong answer, not a failed evaluation
        return False


def grade(
    completion: str, gold: str, *, timeout: Optional[float] = DEFAULT_TIMEOUT, require_boxed: bool = True
) -> bool:
    """True when the last ``\\boxed{}`` answer of ``completion`` is equivalent to ``gold`` (math-verify).

    Safe on any thread and in worker processes; returns False on timeout, on a parse failure and (with
    ``require_boxed``, the default) when the completion has no box. ``gold`` is the bare answer (no box).
    """
    if _on_main_thread():
        return _grade_with_alarm(completion, gold, timeout, require_boxed)
    return _shared_worker().grade(completion, gold, timeout, require_boxed)


# ----------------------------------------------------------------------------------------------------------
# Worker processes (hard deadlines)


def _worker_main() -> None:
    """Worker loop (see :class:`_Worker`): JSON requests on stdin, JSON results on fd 1.

    Grades run on this process's main thread, so the alarm timeout works. Anything a library prints is
    redirected to stderr so it cannot corrupt the protocol.
    """
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    import math_verify  # noqa: F401  (import before signalling ready, so startup is not charged to a grade)

    out.write(json.dumps(["ready", None]) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        key, completion, gold, timeout, require_boxed = json.loads(line)
        out.write(json.dumps([key, _grade_with_alarm(completion, gold, timeout, require_boxed)]) + "\n")


class _Worker:
    """One grading subprocess.

    Started as a plain subprocess rather than with ``multiprocessing``: spawn/forkserver re-import the caller's
    ``__main__`` (a script without a main guard would recurse) and fork is unsafe with torch/CUDA threads.
    """

    def __init__(self) -> None:
        # Import this module with its parent packages stubbed rather than `-m grpo_replay.eval.grading`: the
        # packages' __init__ would import torch (seconds per worker) although grading needs only math-verify and
        # `app.answers`, which the stubs' paths still find.
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        code = (
            "import os, sys, types\n"
            f"for name, sub in (('grpo_replay', ''), ('grpo_replay.app', 'app'), ('grpo_replay.eval', 'eval')):\n"
            f"    m = sys.modules[name] = types.ModuleType(name); m.__path__ = [os.path.join({root!r}, sub)]\n"
            "from grpo_replay.eval.grading import _worker_main\n"
            "_worker_main()\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        self._buf = b""
        self.ready = False

    def fileno(self) -> int:  # lets multiprocessing.connection.wait select on the worker
        return self.proc.stdout.fileno()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def deadline(self, timeout: Optional[float]) -> float:
        budget = (timeout or 3600.0) + _HARD_GRACE + (0.0 if self.ready else _STARTUP_ALLOWANCE)
        return time.monotonic() + budget

    def send(self, key: int, completion: str, gold: str, timeout, require_boxed: bool) -> None:
        msg = json.dumps([key, completion, gold, timeout, require_boxed]) + "\n"
        self.proc.stdin.write(msg.encode("utf-8"))

    def has_message(self) -> bool:
        return b"\n" in self._buf

    def poll(self, seconds: float) -> bool:
        """True when a complete message is buffered or data arrives within ``seconds``."""
        return self.has_message() or bool(mp_wait([self], timeout=max(0.0, seconds)))

    def receive(self):
        """Next message: None for the startup handshake, else (key, result). EOFError if the worker died."""
        while b"\n" not in self._buf:
            chunk = os.read(self.fileno(), 65536)
            if not chunk:
                raise EOFError("grading worker exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        key, value = json.loads(line)
        if key == "ready":
            self.ready = True
            return None
        return key, value

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # EOF ends the worker loop
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class _SharedWorker:
    """The persistent worker behind off-main-thread :func:`grade` calls (one at a time, under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._worker: Optional[_Worker] = None

    def grade(self, completion: str, gold: str, timeout: Optional[float], require_boxed: bool) -> bool:
        with self._lock:
            if self._worker is None or not self._worker.alive():
                self._worker = _Worker()
            worker = self._worker
            deadline = worker.deadline(timeout)
            try:
                worker.send(0, completion, gold, timeout, require_boxed)
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0 or not worker.poll(left):
                        raise TimeoutError
                    msg = worker.receive()
                    if msg is not None:
                        return bool(msg[1])
            except (TimeoutError, EOFError, OSError):
                worker.kill()  # stuck (or dead): replace it on the next call
                self._worker = None
                return False

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.close()
                self._worker = None


_SHARED: Optional[_SharedWorker] = None
_SHARED_LOCK = threading.Lock()


def _shared_worker() -> _SharedWorker:
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = _SharedWorker()
            import atexit

            atexit.register(_SHARED.close)
        return _SHARED


def default_workers(num_items: int) -> int:
    """Worker processes for a batch: none for small batches (spawn costs ~1 s), else up to the CPU count."""
    if num_items < 200:
        return 0
    return max(1, min(8, os.cpu_count() or 1))


def grade_many(
    completions: Sequence[str],
    golds: Sequence[str],
    *,
    workers: Optional[int] = None,
    timeout: Optional[float] = DEFAULT_TIMEOUT,
    require_boxed: bool = True,
    progress: bool = False,
    desc: str = "grading",
) -> list[bool]:
    """Grade ``completions[i]`` against ``golds[i]`` for every i; identical pairs are graded once.

    ``workers``: 0 grades in this process (through :func:`grade`), N >= 1 uses N spawned worker processes with
    hard per-item deadlines, None picks :func:`default_workers`.
    """
    if len(completions) != len(golds):
        raise ValueError(f"completions ({len(completions)}) and golds ({len(golds)}) must have the same length")
    if workers is not None and workers < 0:
        raise ValueError(f"workers must be >= 0 or None, got {workers}")
    unique = list(dict.fromkeys(zip(completions, golds)))
    n_workers = default_workers(len(unique)) if workers is None else workers
    from tqdm.auto import tqdm

    bar = tqdm(total=len(unique), desc=desc, disable=not progress, leave=False)
    try:
        if n_workers == 0:
            results = []
            for completion, gold in unique:
                results.append(grade(completion, gold, timeout=timeout, require_boxed=require_boxed))
                bar.update(1)
        else:
            results = _grade_in_pool(unique, min(n_workers, max(1, len(unique))), timeout, require_boxed, bar)
    finally:
        bar.close()
    by_pair = dict(zip(unique, results))
    return [by_pair[pair] for pair in zip(completions, golds)]


def _grade_in_pool(items, n_workers: int, timeout, require_boxed: bool, bar) -> list[bool]:
    """Dynamic dispatch of items to worker processes; an item past its hard deadline grades False."""
    results = [False] * len(items)
    if not items:
        return results
    pending = deque(range(len(items)))
    workers = [_Worker() for _ in range(n_workers)]
    active: dict[_Worker, tuple[int, float]] = {}  # worker -> (item index, hard deadline)
    try:
        while pending or active:
            for w in workers:
                if w not in active and pending:
                    idx = pending.popleft()
                    w.send(idx, items[idx][0], items[idx][1], timeout, require_boxed)
                    active[w] = (idx, w.deadline(timeout))
            wait_for = max(0.0, min(dl for _, dl in active.values()) - time.monotonic())
            # A worker may already hold a full message in its buffer (e.g. right after the handshake).
            ready = {w for w in active if w.has_message()} or set(mp_wait(list(active), timeout=wait_for))
            for w in list(active):
                idx, dl = active[w]
                if w in ready:
                    try:
                        msg = w.receive()
                    except (EOFError, OSError):
                        msg = (idx, False)  # the worker died (e.g. out of memory): wrong, and replace it
                        _replace(workers, w)
                    if msg is None:  # startup handshake; the item is still running, with the full budget
                        active[w] = (idx, w.deadline(timeout))
                        continue
                    results[idx] = bool(msg[1])
                    del active[w]
                    bar.update(1)
                elif time.monotonic() > dl:
                    del active[w]
                    _replace(workers, w)
                    bar.update(1)  # results[idx] stays False
    finally:
        for w in workers:
            w.close()
    return results


def _replace(workers: list[_Worker], dead: _Worker) -> None:
    dead.kill()
    workers[workers.index(dead)] = _Worker()

