"""A run's JSONL logs (metrics.jsonl, evals.jsonl): one row a line, each a JSON object with an integer `step`.

One reader for every layer that reads a run (trainer, plotting, experiments, scripts): a run still training, or
killed mid-write, can end in a line cut short, so a line that is not a whole row is skipped, never an error.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from ..metric_names import canonical


def _rows(path: Path, key: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(line, row) for every line of `path` that is a JSON object with an integer `row[key]`."""
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get(key), int):
            yield line, row


def read(path: Path, key: str = "step") -> list[dict[str, Any]]:
    """The whole rows of a JSONL log ([] when it does not exist): a torn, empty or non-row line is skipped."""
    return [row for _, row in _rows(path, key)] if Path(path).is_file() else []


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """`read` of a metrics.jsonl, every row under the names of `grpo_replay.metric_names` (an older run's
    backend-specific names renamed)."""
    return [canonical(row) for row in read(path)]


def append(path: Path, row: dict[str, Any]) -> None:
    """One row at the end of `path` (created when missing)."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def truncate(path: Path, step: int, key: str = "step") -> None:
    """Keep the rows with row[key] <= step and drop the rest (a resumed run redoes the steps after its checkpoint).

    A line cut short by a kill mid-write is dropped too (it can only belong to a step being redone); the file is
    replaced atomically, so a second crash here cannot lose the rows before the checkpoint."""
    path = Path(path)
    if not path.exists():
        return
    keep = [line + "\n" for line, row in _rows(path, key) if row[key] <= step]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write("".join(keep))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
