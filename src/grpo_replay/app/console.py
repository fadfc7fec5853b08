"""Clean terminal output during training: one progress bar (grpo-replay's), each warning once, above the bar.

Without this, transformers draws its own bars for sub-second operations (loading the warm start's weights,
"Writing model shards" at every checkpoint) into the middle of the trainer's bar, and a warning raised every step
(a generation setting, a deprecation) repeats on every line. `quiet_third_party` turns off the bars of
transformers / huggingface_hub / datasets for the duration of a call, and routes Python warnings and transformers'
logged warnings through `tqdm.write` (printed above the bar, not into it), each distinct message once. Everything
is restored afterwards.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import sys
import warnings
from typing import Any, Callable, Iterator


def _write(msg: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(msg.rstrip("\n"), file=sys.stderr)


class _OnceHandler(logging.Handler):
    def __init__(self, seen: set):
        super().__init__(logging.WARNING)
        self.seen = seen
        self.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = self.format(record)
        except Exception:  # a malformed log call must not stop training
            return
        if msg not in self.seen:
            self.seen.add(msg)
            _write(msg)


@contextlib.contextmanager
def clean_output() -> Iterator[None]:
    seen: set = set()
    restore: list[Callable[[], Any]] = []
    try:
        import transformers.utils.logging as tlog

        if tlog.is_progress_bar_enabled():
            tlog.disable_progress_bar()
            restore.append(tlog.enable_progress_bar)
        handler = _OnceHandler(seen)
        tlog.disable_default_handler()
        tlog.add_handler(handler)
        restore += [lambda: tlog.remove_handler(handler), tlog.enable_default_handler]
    except ImportError:
        pass
    try:
        import huggingface_hub.utils as hub

        if not hub.are_progress_bars_disabled():
            hub.disable_progress_bars()
            restore.append(hub.enable_progress_bars)
    except ImportError:
        pass
    if "datasets" in sys.modules:  # only when already imported: importing datasets costs seconds
        ds = sys.modules["datasets"]
        if hasattr(ds, "is_progress_bar_enabled") and ds.is_progress_bar_enabled():
            ds.disable_progress_bars()
            restore.append(ds.enable_progress_bars)

    def show_once(message, category, filename, lineno, file=None, line=None):
        key = (category, str(message))
        if key not in seen:
            seen.add(key)
            _write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():  # restores warnings.showwarning and the filters on exit
        warnings.showwarning = show_once
        try:
            yield
        finally:
            for undo in reversed(restore):
                undo()


def quiet_third_party(fn: Callable) -> Callable:
    """Decorator: run fn under `clean_output()`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with clean_output():
            return fn(*args, **kwargs)

    return wrapper
