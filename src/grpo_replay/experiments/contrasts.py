"""A comparison's pre-registered contrasts (`Comparison.pairs`) on the final held-out sampled accuracy: each a - b
paired by seed with its 95 % t-interval, half-width and MDE, and the seeds at which the half-width would reach the
target at the observed spread (`stats.seeds_for_half_width`): the input of a rule that adds seeds where an interval
stays wide (docs/results/PLAN.md, section H). The rule reads only the spread, never the sign or size of a difference.
"""
from __future__ import annotations

from .markdown import table
from .stats import Run, format_ci, paired_diff, seeds_for_half_width

HALF_WIDTH_TARGET = 0.008
"""The half-width a contrast aims for: 0.8 pp of accuracy."""
KEY = "acc_sampled"


def rows(runs: dict[str, list[Run]], pairs: tuple[tuple[str, str], ...], target: float = HALF_WIDTH_TARGET) -> list[dict]:
    """One row per pair whose arms both ran: {"a", "b", "diff" (paired_ci), "half_width", "seeds_for_target"}."""
    out = []
    for a, b in pairs:
        if not (runs.get(a) and runs.get(b)):
            continue
        d = paired_diff(runs[a], runs[b], lambda r: r.final[KEY])
        half = None if d["lo"] is None else (d["hi"] - d["lo"]) / 2
        out.append({"a": a, "b": b, "diff": d, "half_width": half, "target": target,
                    "seeds_for_target": seeds_for_half_width(d["sd"], target)})
    return out


def markdown(contrasts: list[dict], labels: dict[str, str]) -> list[str]:
    if not contrasts:
        return []
    target = contrasts[0]["target"]
    header = ["contrast", "Δ final sampled (pp)", "half-width (pp)", f"seeds for a half-width of {100 * target:.1f} pp"]
    body = [[f"{labels.get(c['a'], c['a'])} - {labels.get(c['b'], c['b'])}",
             format_ci(c["diff"], fmt="{:+.1f}", star=True, n=True, show_mde=True, missing="–"),
             "–" if c["half_width"] is None else f"{100 * c['half_width']:.2f}",
             "–" if c["seeds_for_target"] is None else str(c["seeds_for_target"])]
            for c in contrasts]
    return ["Pre-registered contrasts, paired by seed (95 % CI, * when it excludes 0; MDE at 80 % power); the last "
            "column is the fewest seeds at which the interval's half-width would be at most the target, at the "
            "spread observed here.", "", table(header, body), ""]
