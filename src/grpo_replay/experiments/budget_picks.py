"""Which arm to pick at a budget: on each axis (generated rollouts, update row-passes, training time), at each budget
where some arm's runs end on every seed, the arm with the highest mean held-out sampled accuracy among the arms
measured there on every seed, and its paired difference to the runner-up (docs/results/PLAN.md, section H).

The budgets are not chosen: they are each arm's own end (the smallest final x over its seeds), so an arm whose runs
end earlier is compared only where it was measured, never extrapolated. A pick whose paired interval against the
runner-up includes 0 is a tie at this number of seeds, and the table says so.
"""
from __future__ import annotations

from .axis_runs import AxisRun, paired_at
from .markdown import table
from .stats import ci, format_ci, interp


def picks(runs: dict[str, dict[int, AxisRun]], axis: str) -> list[dict]:
    """One row per budget x on `axis` (each arm's end, ascending): {"x", "arms" (measured there on every seed), "best",
    "acc" (its ci), "runner_up", "diff" (best - runner-up, paired) or None with one arm}."""
    ends = sorted({min(r.xs[axis][-1] for r in rs.values()) for rs in runs.values() if rs})
    out = []
    for x in ends:
        here = {a: ci([interp(r.xs[axis], r.ys, x) for r in rs.values()]) for a, rs in runs.items()
                if rs and all(interp(r.xs[axis], r.ys, x) is not None for r in rs.values())}
        if not here or x <= 0:
            continue
        order = sorted(here, key=lambda a: -here[a]["mean"])
        best, second = order[0], (order[1] if len(order) > 1 else None)
        out.append({"x": x, "arms": order, "best": best, "acc": here[best], "runner_up": second,
                    "diff": paired_at(runs[best], runs[second], axis, x) if second else None})
    return out


def markdown(all_picks: dict[str, list[dict]], axes_named, labels: dict[str, str]) -> list[str]:
    rows = []
    for ax, name in axes_named:
        for p in all_picks.get(ax, []):
            d = p["diff"]
            tie = d is not None and (d["lo"] is None or d["lo"] <= 0)
            rows.append([name, f"{p['x']:,.1f}" if ax == "train_s" else f"{p['x']:,.0f}",
                         labels.get(p["best"], p["best"]) + (" (tie)" if tie else ""),
                         format_ci(p["acc"]),
                         "–" if p["runner_up"] is None else labels.get(p["runner_up"], p["runner_up"]),
                         "–" if d is None else format_ci(d, fmt="{:+.1f}", star=True, show_mde=True, missing="–"),
                         str(len(p["arms"]))])
    if not rows:
        return []
    return ["Which arm to pick at a budget: on each axis, at each arm's own end (the smallest over its seeds), the arm "
            "with the highest mean sampled accuracy among those measured there on every seed, and its paired "
            "difference to the runner-up (95 % CI, * when it excludes 0, MDE); (tie) when that interval includes 0.",
            "", table(["axis", "budget", "pick", "sampled (%)", "runner-up", "pick - runner-up (pp)", "arms measured"],
                      rows), ""]
