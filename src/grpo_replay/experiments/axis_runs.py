"""One finished run's held-out sampled accuracy on three budget axes (generated rollouts, update row-passes, training
time; `alternatives.py` says how each is counted), and the paired difference of two arms at one budget on an axis:
what the alternatives section and the budget picks (`budget_picks.py`) both measure.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..app import jsonl
from ..app.run_files import EVALS, METRICS
from .stats import interp, paired_ci

KEY = "acc_sampled"


@dataclass
class AxisRun:
    """One finished run on the three axes: x per evaluation on each axis, the held-out accuracy per evaluation."""

    seed: int
    xs: dict[str, list[float]]
    ys: list[float]


def run_axes(evals: list[dict], metrics: list[dict], seed: int = 0) -> AxisRun:
    """`AxisRun` of a run's evals.jsonl and metrics.jsonl rows (an evaluation at step k sees steps 1..k)."""
    at = {0: (0.0, 0.0)}
    row_passes = seconds = 0.0
    for m in sorted(metrics, key=lambda m: m["step"]):
        row_passes += float(m.get("update_rows") or 0) * float(m.get("epochs/passes", 1))
        seconds += float(m.get("time/step_s") or 0.0) - float(m.get("time/drift_s") or 0.0)
        at[int(m["step"])] = (row_passes, seconds)
    evals = [e for e in evals if int(e["step"]) in at]
    return AxisRun(seed, {
        "generated": [float(e["generated"]) for e in evals],
        "row_passes": [at[int(e["step"])][0] for e in evals],
        "train_s": [at[int(e["step"])][1] for e in evals],
    }, [float(e[KEY]) for e in evals])


def load(run_dir: Path, seed: int) -> AxisRun:
    run_dir = Path(run_dir)
    return run_axes(jsonl.read(run_dir / EVALS), jsonl.read_metrics(run_dir / METRICS), seed)


def equal_budget(a: dict[int, AxisRun], b: dict[int, AxisRun], axis: str) -> Optional[float]:
    """The largest budget on `axis` that both arms' curves reach on every shared seed (None without shared seeds)."""
    seeds = sorted(set(a) & set(b))
    return min(min(a[s].xs[axis][-1], b[s].xs[axis][-1]) for s in seeds) if seeds else None


def paired_at(a: dict[int, AxisRun], b: dict[int, AxisRun], axis: str, x: Optional[float] = None) -> dict:
    """Per-seed accuracy of `a` minus `b` at `x` on `axis` (both curves linear between evaluations; `x` defaults to
    `equal_budget`), with its paired 95 % t-interval and MDE; "x" says where it was taken."""
    x = equal_budget(a, b, axis) if x is None else x
    seeds = sorted(set(a) & set(b))
    diffs = [None if x is None else _minus(interp(a[s].xs[axis], a[s].ys, x), interp(b[s].xs[axis], b[s].ys, x))
             for s in seeds]
    return {**paired_ci(diffs), "x": x}


def _minus(u: Optional[float], v: Optional[float]) -> Optional[float]:
    return None if u is None or v is None else u - v
