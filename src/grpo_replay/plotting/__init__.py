"""Every PNG the project draws: a run's own plots, a comparison's, `grpo-replay plot`'s and an evaluation's.

One place sets matplotlib's non-interactive backend and writes figures: `save` renders to a temporary file beside
the target and renames it into place, so a full disk or a kill mid-write never leaves a truncated PNG.
"""
from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plt", "save"]


def save(fig, path: Path, dpi: int = 110, tight: bool = True) -> Path:
    """Lay out, write `path` atomically at `dpi` and close the figure (pyplot keeps every open figure alive
    otherwise). On an error the target is left as it was and the partial file is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if tight:
            fig.tight_layout()
        fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".").lower() or "png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path
