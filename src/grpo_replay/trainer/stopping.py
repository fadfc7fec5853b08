"""How a built-in training run stops early: the exceptions `train` raises, and SIGINT / SIGTERM handling."""
from __future__ import annotations

import signal
import threading
from typing import Any

from tqdm.auto import tqdm

from ..errors import Stopped


class TrainingStopped(Stopped):
    """Raised after max_bad_steps consecutive non-finite losses (a checkpoint was written first)."""


class CheckpointError(Stopped):
    """Writing a checkpoint failed (e.g. disk full); the previous checkpoint is intact and the run stops."""


class TrainingInterrupted(TrainingStopped):
    """SIGINT / SIGTERM arrived: the step under way finished, a checkpoint was written, the run stopped."""


class StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM (`kill`, schedulers, `docker stop`) ask the run to stop after the step under
    way, with a checkpoint, instead of losing every step since the last periodic one. A second SIGINT stops at
    once (KeyboardInterrupt). A signal ignored when the run started stays ignored (a background job's SIGINT),
    and outside the main thread nothing is installed (signal handlers can only be set there)."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        tqdm.write(f"grpo-replay: {self.received} received; stopping after this step with a checkpoint "
                   "(Ctrl-C again stops at once, without one)")

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
