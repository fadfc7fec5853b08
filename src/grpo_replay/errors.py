"""The exception tree, and the exit codes the command line maps it to (once, in `cli.py`).

- `UsageError` (exit 2): the input is wrong (a setting, a file, a directory); nothing was computed or lost, and
  rerunning the same command fails the same way. Every bad-input error derives from it.
- `Stopped` (exit 1): the run stopped part-way with a resumable checkpoint; rerunning the same command resumes.

Both also derive from the built-in class code outside this package expects (`ValueError`, `RuntimeError`), so
an ``except ValueError`` around a constructor catches a bad setting.
"""
from __future__ import annotations

EXIT_OK, EXIT_STOPPED, EXIT_USAGE = 0, 1, 2


class GrpoReplayError(Exception):
    """Base of every error this package raises on purpose."""


class UsageError(GrpoReplayError, ValueError):
    """Bad input: exit 2, before any compute."""


class InputNotFound(UsageError, FileNotFoundError):
    """A path the user gave (model, data, benchmark) does not exist: exit 2. Still a FileNotFoundError, so code
    catching that keeps working; a FileNotFoundError raised anywhere else is not bad input and keeps its traceback."""


class Stopped(GrpoReplayError, RuntimeError):
    """A run stopped with a resumable checkpoint: exit 1, rerun to resume."""


class ConfigError(UsageError):
    """An invalid configuration field (its message names the field and the allowed values)."""


def exit_code(exc: BaseException) -> int | None:
    """The exit code for `exc`, or None when it is not one of ours (a bug: let it show its traceback)."""
    if isinstance(exc, UsageError):
        return EXIT_USAGE
    if isinstance(exc, Stopped):
        return EXIT_STOPPED
    return None
