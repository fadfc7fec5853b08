"""The paired view of a comparison: each arm's per-seed difference to GRPO along training, the generated rollouts it
needs to reach its own seed's GRPO final accuracy, and what its runs cost and how far their policies drifted.

Unpaired CI bands of two arms overlap when the seeds differ more than the arms do; the paired difference (same
seed, same warm start, same evaluation sampling seed) removes that spread, so this view is the one a paired test
judges. Everything here is read from finished run directories (`evals.jsonl`, `metrics.jsonl`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from ..app import jsonl
from ..app.run_files import METRICS
from .arms import BASE
from .markdown import count, table
from .stats import Run, budget_to_reach, ci, format_diff, interp, paired_ci

REACH_TARGET = 0.6
"""The fraction of GRPO's generated rollouts the report checks each arm against (reaching GRPO's final accuracy)."""

# metrics.jsonl keys read per run: averaged over the steps that log them, summed over them, or the value at the last
# of them (totals the buffer keeps); then a CI over seeds.
REGIME_MEANS = ("drift/kl_1", "drift/kl_tau", "fresh/clip_frac", "replay/clip_frac", "replay/count", "replay/drift_mean")
REGIME_SUMS = ("replay/drift_dropped",)
REGIME_LAST = ("buffer/evicted_uses", "buffer/evicted_age")


def paired_curve(runs: list[Run], base: dict[int, Run], grid: list[float], key: str = "acc_sampled") -> list[dict]:
    """Per grid point (generated rollouts), the paired CI (with MDE) of run - same-seed base, over the seeds where
    both curves are defined there."""
    out = []
    for x in grid:
        diffs = []
        for r in runs:
            b = base.get(r.seed)
            v, bv = interp(*r.curve(key), x), (interp(*b.curve(key), x) if b else None)
            diffs.append(None if v is None or bv is None else v - bv)
        out.append(paired_ci(diffs))
    return out


def reach_ratio(runs: list[Run], base: dict[int, Run], key: str = "acc_sampled") -> dict:
    """Per seed: the generated rollouts at which the arm's curve first reaches its own seed's base final accuracy,
    as a fraction of that base run's generated rollouts (None: never reached). `ci` is over the seeds when every
    seed reached it (a mean over only the seeds that did would be biased low); `median` counts a seed that never
    reached it as above every other. A seed whose GRPO run ended at or below its start is left out
    (`grpo_not_improved`): there every arm would reach it at once."""
    per_seed: dict[int, Optional[float]] = {}
    flat = []
    for r in runs:
        b = base.get(r.seed)
        if b is None:
            continue
        bx, by = b.curve(key)
        if bx[-1] <= 0 or by[-1] <= by[0]:
            flat.append(r.seed)  # GRPO did not improve: every arm would "reach" it at 0 rollouts
            continue
        at = budget_to_reach(*r.curve(key), by[-1])
        per_seed[r.seed] = None if at is None else at / bx[-1]
    vals = list(per_seed.values())
    reached = [v for v in vals if v is not None]
    med = float(np.median([float("inf") if v is None else v for v in vals])) if vals else None
    median = med if med is not None and np.isfinite(med) else None
    return {
        "per_seed": per_seed,
        "ci": ci(vals) if len(reached) == len(vals) else {"mean": None, "lo": None, "hi": None, "n": len(reached), "sd": None},
        "median": median,
        "reached": len(reached),
        "n": len(vals),
        "not_reached": [s for s, v in per_seed.items() if v is None],
        "within_target": sum(v is not None and v <= REACH_TARGET for v in vals),
        "grpo_not_improved": flat,
    }


def run_regime(run_dir: Path) -> dict[str, Optional[float]]:
    """One run's training-step time (sum of `time/step_s` less the drift probe's `time/drift_s`; the held-out
    evaluations are not in it) and its drift regime:
    the step-mean of each REGIME_MEANS key (over the steps that log it), the REGIME_SUMS totals and the last
    REGIME_LAST values; None where the run never logged the key."""
    rows = jsonl.read_metrics(Path(run_dir) / METRICS)
    # time/step_s includes the drift probe (a diagnostic that only some settings turn on): it is left out.
    steps = [float(m["time/step_s"]) - float(m.get("time/drift_s") or 0.0) for m in rows if m.get("time/step_s") is not None]
    out: dict[str, Optional[float]] = {"train_s": float(sum(steps)) if steps else None}
    for keys, reduce in ((REGIME_MEANS, np.mean), (REGIME_SUMS, sum), (REGIME_LAST, lambda v: v[-1])):
        for k in keys:
            vals = [float(m[k]) for m in rows if m.get(k) is not None]
            out[k] = float(reduce(vals)) if vals else None
    return out


def arm_view(runs: list[Run], base: dict[int, Run], run_dirs: dict[int, Path], grid: list[float]) -> dict:
    """Everything the paired section shows for one arm: the paired curve on `grid`, the reach ratio, and the CI
    over seeds of each regime value."""
    regimes = [run_regime(run_dirs[r.seed]) for r in runs if r.seed in run_dirs]
    keys = ["train_s", *REGIME_MEANS, *REGIME_SUMS, *REGIME_LAST]
    return {
        "grid": list(grid),
        "paired_curve": paired_curve(runs, base, grid),
        "reach": reach_ratio(runs, base),
        "regime": {k: ci([g[k] for g in regimes]) for k in keys},
    }


def views_for(specs, runs: dict[str, list[Run]], base: dict[int, Run], grid: list[float]) -> dict[str, dict]:
    """`arm_view` of every arm with runs; `specs` (the compare's RunSpecs) give each (arm, seed)'s directory."""
    run_dirs: dict[str, dict[int, Path]] = {}
    for s in specs:
        run_dirs.setdefault(s.arm, {})[s.seed] = Path(s.run_dir)
    return {a: arm_view(rs, base, run_dirs.get(a, {}), grid) for a, rs in runs.items()}


def _fmt(c: dict, fmt: str) -> str:
    if not c or c.get("mean") is None:
        return "–"
    text = fmt.format(c["mean"])
    return text + (f" [{fmt.format(c['lo'])}, {fmt.format(c['hi'])}]" if c.get("lo") is not None else "")


def _reach_cell(reach: dict) -> str:
    if reach["n"] == 0:
        return "–" if not reach.get("grpo_not_improved") else "– (GRPO did not improve on any seed)"
    if reach["ci"]["mean"] is not None:
        text = _fmt(reach["ci"], "{:.2f}") + "x"
    else:
        med = reach["median"]
        text = f"median {'not reached' if med is None else f'{med:.2f}x'}"
    notes = [f"{reach['reached']}/{reach['n']} reached"]
    if reach["not_reached"]:
        notes.append("not: seed " + ", ".join(str(s) for s in reach["not_reached"]))
    notes.append(f"{reach['within_target']}/{reach['n']} within {REACH_TARGET:g}x")
    if reach.get("grpo_not_improved"):
        notes.append("left out, GRPO did not improve: seed " + ", ".join(str(s) for s in reach["grpo_not_improved"]))
    return f"{text} ({'; '.join(notes)})"


def markdown(names: list[str], labels: dict[str, str], views: dict[str, dict], points: list[float], png: Optional[str]) -> list[str]:
    """The paired section of one comparison; `points` are the generated-rollout budgets of the report's tables
    (points of its paired curves' grid)."""
    lines = ["Paired view (each arm minus GRPO of the same seed):", ""]
    grid = next(iter(views.values()))["grid"] if views else []
    points = [p for p in points if p in grid]
    if points:
        header = ["arm"] + [f"Δ sampled (pp) @ {count(p)}" for p in points] + ["rollouts to its seed's GRPO final acc. (x GRPO's)"]
        rows = []
        for a in names:
            if a not in views:
                continue
            v = views[a]
            cells = ["–" if a == BASE else format_diff(v["paired_curve"][grid.index(p)], show_mde=(p == points[-1]))
                     for p in points]
            # GRPO's own reach: where its curve first reaches its final value (below 1x when it peaked earlier).
            rows.append([labels.get(a, a)] + cells + [_reach_cell(v["reach"])])
        lines += [table(header, rows), ""]
    regime_cols = [("train_s", "training steps (s)", "{:.1f}"), ("drift/kl_1", "drift/kl_1", "{:.2e}"),
                   ("drift/kl_tau", "drift/kl_tau", "{:.2e}"), ("fresh/clip_frac", "fresh clip", "{:.3f}"),
                   ("replay/clip_frac", "replay clip", "{:.3f}"), ("replay/count", "replay rows/step", "{:.1f}"),
                   ("replay/drift_mean", "replay k3 drift", "{:.3f}"), ("replay/drift_dropped", "dropped (drift)", "{:.0f}"),
                   ("buffer/evicted_uses", "evicted (uses)", "{:.0f}")]
    used = [c for c in regime_cols if any(views[a]["regime"][c[0]]["mean"] is not None for a in names if a in views)]
    rows = [[labels.get(a, a)] + [_fmt(views[a]["regime"][k], f) for k, _, f in used] for a in names if a in views]
    lines += [
        "Cost and drift regime per arm (mean over seeds [95 % CI]; training steps = the sum of each run's step times "
        "on one core, less the drift probe, a diagnostic; the held-out evaluations, the same for every arm, are not in "
        "it; the other columns are step means of the run's metrics, or totals):", "", table(["arm"] + [n for _, n, _ in used], rows), ""]
    if png:
        lines += [f"![paired difference to GRPO vs generated rollouts]({png})", ""]
    return lines


