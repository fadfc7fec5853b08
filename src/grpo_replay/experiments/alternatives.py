"""The measures of the `alternatives` comparisons (docs/results/PLAN.md, section G): held-out accuracy on three axes,
and per arm the generated rollouts and the training time it needs to reach the best alternative's final accuracy.

Axes, per evaluation of a run: (1) generated rollouts (every generation round counts), (2) update row-passes, the
sum over the steps so far of `update_rows` x `epochs/passes` (1 without update_epochs), (3) training time, the sum
of `time/step_s` less `time/drift_s` (generation, scoring and updates; the held-out evaluations and the drift probe
are not in it). The alternatives are the arms without replay (`ALTERNATIVES`); the best is the one with the highest
mean final held-out sampled accuracy over seeds, or the comparison's fixed reference arm (`Comparison.reference`),
and its final accuracy on seed s is that seed's target T_s. Every arm's curve on an axis is linear between
evaluations; R, U and W are where it first reaches T_s on the generated, row-pass and time axes, reported per seed as
ratios to the best alternative's own on that seed, and R also absolute. When some seed never reaches T_s, the
median with its distribution-free interval (`stats.median_ci`) stands in for the mean.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from . import budget_picks
from .axis_runs import AxisRun, load, paired_at
from .beyond_binary import NO_REPLAY
from .markdown import table
from .stats import budget_to_reach, ci, interp, median_ci, paired_ci

ALTERNATIVES = ("grpo", "grpo_mu2", "grpo_mu4", "dapo", "dapo_r3", "grpo_long", *NO_REPLAY)
"""The arms without replay: what a user would pick instead (experiments/arms.py)."""
AXES = (("generated", "generated rollouts"), ("row_passes", "update row-passes"), ("train_s", "training time (s)"))
PRESET_CANDIDATE = "fill"
"""The arm whose results decide the `paper_fill` preset (PLAN.md, section G, decision rule)."""


def best_alternative(runs: dict[str, dict[int, AxisRun]]) -> Optional[str]:
    """The alternative with the highest mean final accuracy over its seeds (None when no alternative ran)."""
    finals = {a: float(np.mean([r.ys[-1] for r in rs.values()])) for a, rs in runs.items() if a in ALTERNATIVES and rs}
    return max(finals, key=lambda a: (finals[a], -ALTERNATIVES.index(a))) if finals else None


def _summary(vals: dict[int, Optional[float]]) -> dict:
    """Mean and t-interval when every seed has a value; else the median with its distribution-free interval (a
    missing seed counts as above all: None for a bound beyond every reached value)."""
    v = list(vals.values())
    reached = [x for x in v if x is not None]
    med = float(np.median([np.inf if x is None else x for x in v])) if v else None
    return {
        "per_seed": vals,
        "ci": ci(v) if v and len(reached) == len(v) else {"mean": None, "lo": None, "hi": None, "n": len(reached), "sd": None},
        "median": med if med is not None and np.isfinite(med) else None,
        "median_ci": median_ci(v),
        "not_reached": [s for s, x in vals.items() if x is None],
        "n": len(v),
    }


_REACH = (("R", "generated"), ("U", "row_passes"), ("W", "train_s"))
"""The reach measures and their axes: generated rollouts, update row-passes, training time."""


def reach(arm: dict[int, AxisRun], best: dict[int, AxisRun]) -> dict:
    """R (generated rollouts), U (update row-passes) and W (training seconds) at which the arm first reaches each
    seed's target, absolute and as ratios to the best alternative's own; a seed whose best-alternative run reached
    its final accuracy at its start (R_best = 0: it did not improve) is left out of the ratios."""
    vals = {m: {} for m, _ in _REACH}
    ratios = {m: {} for m, _ in _REACH}
    left_out = []
    for seed, run in sorted(arm.items()):
        b = best.get(seed)
        if b is None:
            continue
        target = b.ys[-1]
        own = {m: budget_to_reach(b.xs[ax], b.ys, target) for m, ax in _REACH}
        for m, ax in _REACH:
            vals[m][seed] = budget_to_reach(run.xs[ax], run.ys, target)
        if not all(own.values()):
            left_out.append(seed)
            continue
        for m, _ in _REACH:
            ratios[m][seed] = None if vals[m][seed] is None else vals[m][seed] / own[m]
    return {**{m: _summary(vals[m]) for m, _ in _REACH}, **{f"{m}_ratio": _summary(ratios[m]) for m, _ in _REACH},
            "left_out": left_out}


def curve(runs: dict[int, AxisRun], axis: str) -> dict:
    """Mean and 95 % t-interval over seeds of the accuracy on `axis`, on the grid of every seed's evaluation points
    (a point where some seed's curve is not defined is left out)."""
    grid = sorted({x for r in runs.values() for x in r.xs[axis]})
    out = []
    for x in grid:
        vals = [interp(r.xs[axis], r.ys, x) for r in runs.values()]
        out.append(ci(vals) if all(v is not None for v in vals) else {"mean": None})
    return {"grid": grid, "ci": out}


def section(run_dirs: dict[str, dict[int, Path]], reference: Optional[str] = None,
            pairs: tuple[tuple[str, str], ...] = ()) -> dict:
    """Everything the alternatives section shows, from the finished runs' directories (arm -> seed -> dir). With
    `reference`, that arm's final accuracy is each seed's target instead of the best alternative's; `pairs` adds
    paired differences a - b beyond every replay arm minus every alternative."""
    runs = {a: {s: load(d, s) for s, d in dirs.items()} for a, dirs in run_dirs.items()}
    best = (reference if runs.get(reference) else None) if reference else best_alternative(runs)
    sec = {
        "best_alternative": best,
        "reference_fixed": reference is not None,
        "final": {a: ci([r.ys[-1] for r in rs.values()]) for a, rs in runs.items()},
        "reach": {a: reach(rs, runs[best]) for a, rs in runs.items()} if best else {},
        "totals": {a: {ax: ci([r.xs[ax][-1] for r in rs.values()]) for ax, _ in AXES} for a, rs in runs.items()},
        "curves": {a: {ax: curve(rs, ax) for ax, _ in AXES} for a, rs in runs.items()},
        "paired": paired(runs, pairs),
        "picks": {ax: budget_picks.picks(runs, ax) for ax, _ in AXES},
    }
    sec["preset_rule"] = preset_rule(sec)
    return sec


def paired(runs: dict[str, dict[int, AxisRun]], pairs: tuple[tuple[str, str], ...] = ()) -> dict:
    """Every arm with replay minus every alternative, and each of `pairs` (a, b) whose arms both ran: at equal budget
    on each axis, and at their own ends ("final")."""
    alts = [a for a in runs if a in ALTERNATIVES]
    todo = [(arm, alt) for arm in runs if arm not in ALTERNATIVES for alt in alts]
    todo += [(x, y) for x, y in pairs if x in runs and y in runs and (x, y) not in todo]
    out = {}
    for arm, alt in todo:
        a, b = runs[arm], runs[alt]
        out[f"{arm}-{alt}"] = {"arm": arm, "alternative": alt,
                               **{ax: paired_at(a, b, ax) for ax, _ in AXES},
                               "final": paired_ci([a[s].ys[-1] - b[s].ys[-1] for s in sorted(set(a) & set(b))])}
    return out


def preset_rule(sec: dict, arm: str = PRESET_CANDIDATE) -> Optional[dict]:
    """The pre-registered decision rule for the `paper_fill` preset (PLAN.md, section G) on this comparison's runs:
    (1) at equal generated rollouts the arm beats every alternative (paired CI above 0); (2) it reaches the best
    alternative's final accuracy on every seed with fewer rollouts (R / R_best CI upper bound below 1); (3) it does
    not lose on training time (W / W_best mean at most 1.0, CI upper bound at most 1.10). None when the arm or the
    best alternative did not run."""
    best = sec.get("best_alternative")
    if not best or arm not in sec.get("reach", {}):
        return None
    vs = {p["alternative"]: p["generated"] for p in sec["paired"].values() if p["arm"] == arm}
    r, w = sec["reach"][arm]["R_ratio"], sec["reach"][arm]["W_ratio"]
    rule1 = bool(vs) and all(c["lo"] is not None and c["lo"] > 0 for c in vs.values())
    rule2 = not r["not_reached"] and r["ci"]["hi"] is not None and r["ci"]["hi"] < 1.0
    rule3 = w["ci"]["mean"] is not None and w["ci"]["mean"] <= 1.0 and w["ci"]["hi"] is not None and w["ci"]["hi"] <= 1.10
    return {"arm": arm, "best": best, "rule1": rule1, "rule2": rule2, "rule3": rule3,
            "holds": rule1 and rule2 and rule3}


def _ci_text(c: dict, fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    if c.get("mean") is None:
        return "–"
    text = fmt.format(scale * c["mean"]) + suffix
    return text + (f" [{fmt.format(scale * c['lo'])}, {fmt.format(scale * c['hi'])}]" if c.get("lo") is not None else "")


def _reach_text(s: dict, fmt: str = "{:.2f}", suffix: str = "x") -> str:
    if s["ci"]["mean"] is not None:
        return _ci_text(s["ci"], fmt, suffix=suffix)
    if s["median"] is None:
        text = "median not reached"
    else:
        m = s["median_ci"]
        bound = lambda x: "not reached" if x is None else fmt.format(x) + suffix  # noqa: E731
        text = f"median {fmt.format(s['median'])}{suffix}" + (
            f" [{bound(m['lo'])}, {bound(m['hi'])}]" if m["coverage"] is not None and m["lo"] is not None else "")
    if s["not_reached"]:
        text += f" ({s['n'] - len(s['not_reached'])}/{s['n']} reached; not: seed {', '.join(map(str, s['not_reached']))})"
    return text


def markdown(names: list[str], labels: dict[str, str], sec: dict, png: Optional[str]) -> list[str]:
    """The section's lines: per arm, the totals on each axis, and R, U and W against the target arm's final accuracy."""
    best = sec.get("best_alternative")
    if not best:
        return ["No alternative without replay has finished runs: the reach measure is not computed.", ""]
    header = ["arm", "final sampled (%)", *(f"{name} (total)" for _, name in AXES),
              "rollouts to T", f"rollouts to T (x {best}'s)", f"row-passes to T (x {best}'s)",
              f"training time to T (x {best}'s)"]
    rows = [[labels.get(a, a), _ci_text(sec["final"][a], "{:.1f}", 100.0),
             *(_ci_text(sec["totals"][a][ax], "{:,.1f}" if ax == "train_s" else "{:,.0f}") for ax, _ in AXES),
             _reach_text(sec["reach"][a]["R"], "{:,.0f}", ""),
             *(_reach_text(sec["reach"][a][f"{m}_ratio"]) for m in ("R", "U", "W"))]
            for a in names if a in sec["final"]]
    which = ("the reference arm fixed in advance" if sec.get("reference_fixed") else
             "the best alternative without replay (the highest mean final sampled accuracy among the arms without replay)")
    lines = [f"Against {which}, **{labels.get(best, best)}**: T = its final accuracy on each seed; an arm's rollouts, "
             "update row-passes and training time to T are where its curve first reaches T, absolute and as a ratio "
             "to the reference's own on that seed, mean [95 % CI] over seeds (when some seed never reached T: the "
             "median [distribution-free interval of at least 95 % from the order statistics; 'not reached' for a "
             "bound past the last seed that reached it]). Totals are per run at its end; training time is the steps' "
             "time, held-out evaluations and the drift probe left out.", "",
             table(header, rows), ""]
    if png:
        lines += [f"![accuracy vs generated rollouts, update row-passes and training time]({png})", ""]
    return (lines + _paired_lines(labels, sec) + budget_picks.markdown(sec.get("picks") or {}, AXES, labels)
            + _rule_lines(labels, sec.get("preset_rule")))


def _paired_text(c: dict, budget: bool = True) -> str:
    if c.get("mean") is None:
        return "–"
    star = "*" if c["lo"] is not None and (c["lo"] > 0 or c["hi"] < 0) else ""
    text = f"{100 * c['mean']:+.1f}" + (f" [{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}]{star}" if c["lo"] is not None else "")
    if c.get("mde") is not None:
        text += f" (MDE {100 * c['mde']:.1f})"
    return text + (f" @ {c['x']:,.0f}" if budget and c.get("x") is not None else "")


def _paired_lines(labels: dict[str, str], sec: dict) -> list[str]:
    if not sec.get("paired"):
        return []
    header = ["arm - other", *(f"Δ sampled (pp) at equal {name}" for _, name in AXES), "Δ final sampled (pp)"]
    rows = [[f"{labels.get(p['arm'], p['arm'])} - {labels.get(p['alternative'], p['alternative'])}",
             *(_paired_text(p[ax]) for ax, _ in AXES), _paired_text(p["final"], budget=False)]
            for p in sec["paired"].values()]
    return ["Each arm with replay minus each alternative (and the comparison's own pairs), paired by seed, 95 % CI "
            "(* when it excludes 0) and MDE: "
            "at equal budget on each axis (the largest both arms reach on every seed, after @; curves linear between "
            "evaluations), and at each arm's own end.", "", table(header, rows), ""]


def _rule_lines(labels: dict[str, str], rule: Optional[dict]) -> list[str]:
    if not rule:
        return []
    said = {True: "holds", False: "does not hold"}
    return [f"Decision rule for a `paper_fill` preset ({labels.get(rule['arm'], rule['arm'])}, PLAN.md section G): "
            f"(1) beats every alternative at equal generated rollouts: {said[rule['rule1']]}; (2) reaches "
            f"{labels.get(rule['best'], rule['best'])}'s final accuracy on every seed with fewer rollouts: "
            f"{said[rule['rule2']]}; (3) does not lose on training time: {said[rule['rule3']]}. "
            + ("All three hold" if rule["holds"] else "Not all three hold") + " on these runs.", ""]
