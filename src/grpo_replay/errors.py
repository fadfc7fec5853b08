"""The exception tree, and the one mapping from it to exit codes (`exit_code` and `headline`, called only by
`cli.main`).

- `UsageError` (exit 2): the input is wrong (a setting, a flag, a file, a directory); nothing was computed or lost,
  and rerunning the same command fails the same way. Every bad-input error derives from it.
- `Stopped` (exit 1): the run stopped part-way with a resumable checkpoint; rerunning the same command resumes.

Both also derive from the built-in class code outside this package expects (`ValueError`, `RuntimeError`), so
an ``except ValueError`` around a constructor catches a bad setting. Any other exception is a bug and keeps its
traceback.
"""
from __future__ import annotations

EXIT_OK, EXIT_STOPPED, EXIT_USAGE = 0, 1, 2


class GrpoReplayError(Exception):
    """Base of every error this package raises on purpose."""


class UsageError(GrpoReplayError, ValueError):
    """Bad input: exit 2, before any compute. The message names the field (or flag) and the allowed values."""


class ConfigError(UsageError):
    """An invalid configuration field (its message names the field and the allowed values)."""


class InputNotFound(UsageError, FileNotFoundError):
    """A path the user gave (model, data, benchmark) does not exist: exit 2. Still a FileNotFoundError, so code
    catching that keeps working; a FileNotFoundError raised anywhere else is not bad input and keeps its traceback."""


class MissingDependency(UsageError, ImportError):
    """An optional package the chosen setting needs is not installed (the message says what to install): exit 2.
    Still an ImportError; an ImportError raised anywhere else is a broken install and keeps its traceback."""


class Stopped(GrpoReplayError, RuntimeError):
    """A run stopped with a resumable checkpoint: exit 1, rerun to resume."""


# (class, exit code, the word the command line puts before the message); the first class that matches wins.
_EXITS: tuple[tuple[type[BaseException], int, str], ...] = (
    (ConfigError, EXIT_USAGE, "config error"),
    (UsageError, EXIT_USAGE, "error"),
    (Stopped, EXIT_STOPPED, "stopped"),
)


def _entry(exc: BaseException) -> tuple[type[BaseException], int, str] | None:
    return next((e for e in _EXITS if isinstance(exc, e[0])), None)


def exit_code(exc: BaseException) -> int | None:
    """The exit code for `exc`, or None when it is not one of ours (a bug: let it show its traceback)."""
    entry = _entry(exc)
    return entry[1] if entry else None


def headline(command: str, exc: BaseException) -> str:
    """The one line the command line prints for `exc` (one of ours), e.g.
    ``grpo-replay train: config error: TrainConfig.lr=-1.0 is invalid; allowed: a number > 0``."""
    entry = _entry(exc)
    if entry is None:
        raise TypeError(f"headline: {type(exc).__name__} is not one of grpo_replay.errors' exit-mapped classes")
    return f"grpo-replay {command}: {entry[2]}: {exc}"
