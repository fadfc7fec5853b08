"""Statistics over seeds: t-distribution 95 % confidence intervals, paired differences vs GRPO (with their minimum
detectable effect, `mde`), budget curves.

All metric arithmetic (mean@n, pass@k, AES, relative length change) comes from `grpo_replay.eval.metrics`; this
module only reads run directories and aggregates over seeds. Seeds are paired across arms (seed i of every arm
starts from the same warm start and evaluates with the same sampling seed), so differences vs GRPO are computed
per seed and then summarised.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..app import jsonl
from ..app.run_files import EVALS, METRICS, SUMMARY
from ..app.provenance import cpu_kind
from ..eval.metrics import aes, evaluate_correctness, relative_change
from .continuation import continued_commit

CONFIDENCE = 0.95
POWER = 0.80  # the power of the minimum detectable effect (`mde`)


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """Two-sided t critical value: `t_ppf(0.5 + confidence / 2, df)`."""
    return t_ppf(0.5 + confidence / 2, df)


# Without scipy: Student's t quantiles for df = 1..30 (normal beyond), at the two levels the reports use.
_T_TABLE = {
    0.975: ([12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
             2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
             2.045, 2.042], 1.96),
    0.80: ([1.376, 1.061, 0.978, 0.941, 0.920, 0.906, 0.896, 0.889, 0.883, 0.879, 0.876, 0.873, 0.870, 0.868,
            0.866, 0.865, 0.863, 0.862, 0.861, 0.860, 0.859, 0.858, 0.858, 0.857, 0.856, 0.856, 0.855, 0.855,
            0.854, 0.854], 0.8416),
}


def t_ppf(p: float, df: int) -> float:
    """The p quantile of Student's t with df degrees of freedom (scipy when installed; otherwise a table for
    p = 0.975 and p = 0.80, normal beyond df 30)."""
    try:
        from scipy import stats

        return float(stats.t.ppf(p, df))
    except ImportError:  # pragma: no cover - scipy is a dev dependency
        for level, (table, normal) in _T_TABLE.items():
            if abs(p - level) < 1e-9:
                return table[df - 1] if df <= 30 else normal
        raise


def mde(sd: Optional[float], n: int, confidence: float = CONFIDENCE, power: float = POWER) -> Optional[float]:
    """Minimum detectable effect of a paired comparison over n seeds: the true mean difference that a two-sided
    paired t-test at `confidence` (95 %) detects with probability `power` (80 %), given the spread sd of the
    per-seed differences (paired t approximation, df = n - 1):

        MDE = (t_{1 - alpha/2, n-1} + t_{power, n-1}) * sd / sqrt(n),   alpha = 1 - confidence

    = (t_{0.975, n-1} + t_{0.80, n-1}) * sd / sqrt(n) at the defaults. The held-out evaluation's sampling noise is
    already inside each seed's value, so sd holds it too. None when n < 2 (no spread to estimate)."""
    if sd is None or n is None or n < 2 or _nan(sd):
        return None
    return detectable(sd / math.sqrt(n), n - 1, confidence, power)


def seeds_for_half_width(sd: Optional[float], target: float, n_max: int = 1000,
                         confidence: float = CONFIDENCE) -> Optional[int]:
    """The fewest seeds n (>= 2) at which a paired difference whose per-seed differences spread with sd has a
    two-sided t-interval half-width t_{1 - alpha/2, n-1} x sd / sqrt(n) of at most `target`; None when sd is
    unknown or more than n_max seeds would be needed."""
    if sd is None or _nan(sd):
        return None
    for n in range(2, n_max + 1):
        if t_quantile(n - 1, confidence) * sd / math.sqrt(n) <= target:
            return n
    return None


def detectable(se: float, df: int, confidence: float = CONFIDENCE, power: float = POWER) -> float:
    """The true effect a two-sided t-test at `confidence` detects with probability `power`, for an estimate with
    standard error se and df degrees of freedom: (t_{1 - alpha/2, df} + t_{power, df}) * se. `mde` (a mean of
    paired differences) and `slope_ci` (a regression slope) both use it."""
    return (t_ppf(0.5 + confidence / 2, df) + t_ppf(power, df)) * se


def format_ci(
    c: Optional[dict], *, scale: float = 100.0, fmt: str = "{:.1f}", unit: str = "", star: bool = False,
    n: bool = False, missing: str = "n/a", show_mde: bool = False,
) -> str:
    """`mean [lo, hi]` of a `ci` / `paired_diff` dict, each value times `scale` written with `fmt` (`unit` after the
    mean); the interval is left out when there is none (fewer than 2 values). star: a `*` when the interval excludes
    0; n: ` (n=N)` after it; show_mde: the minimum detectable effect too, ` (n=N, MDE x)` (`MDE n/a` below 2
    values); missing: the text for an absent value. The one formatter of every table and claim."""
    if not c or c.get("mean") is None:
        return missing
    text = fmt.format(scale * c["mean"]) + unit
    if c.get("lo") is not None:
        text += f" [{fmt.format(scale * c['lo'])}, {fmt.format(scale * c['hi'])}]"
        if star and (c["lo"] > 0 or c["hi"] < 0):
            text += "*"
    notes = [f"n={c['n']}"] if n else []
    if show_mde:
        m = c.get("mde")
        notes.append("MDE n/a" if m is None else "MDE " + fmt.replace("+", "").format(scale * m) + unit)
    return text + (f" ({', '.join(notes)})" if notes else "")


def format_diff(c: Optional[dict], **kw) -> str:
    """A signed difference vs GRPO: `format_ci` with a sign, a `*` when significant and `–` when absent."""
    return format_ci(c, **{"fmt": "{:+.1f}", "star": True, "missing": "–", **kw})


def ci(values: Sequence[Optional[float]], confidence: float = CONFIDENCE) -> dict:
    """Mean and t-interval over the non-missing values: {"mean", "lo", "hi", "n", "sd"} (lo/hi None if n < 2)."""
    xs = np.array([v for v in values if v is not None and not _nan(v)], dtype=float)
    n = len(xs)
    if n == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0, "sd": None}
    mean = float(xs.mean())
    if n < 2:
        return {"mean": mean, "lo": None, "hi": None, "n": 1, "sd": None}
    sd = float(xs.std(ddof=1))
    half = t_quantile(n - 1, confidence) * sd / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n, "sd": sd}


def median_ci(values: Sequence[Optional[float]], confidence: float = CONFIDENCE) -> dict:
    """The median of `values` with a distribution-free interval from the order statistics: [x_(k), x_(n+1-k)] with
    the largest k whose binomial tail P(Bin(n, 1/2) < k) is at most (1 - confidence) / 2, so the interval covers the
    median with probability at least `confidence` ("coverage", exact). A None value is one that was never reached
    (above every other): a bound that falls on one is None. {"median", "lo", "hi", "coverage", "n"}; lo, hi and
    coverage are None when n is too small for any k (n <= 5 at 95 %)."""
    n = len(values)
    xs = sorted(math.inf if v is None else float(v) for v in values)
    finite = lambda x: None if math.isinf(x) else x  # noqa: E731
    out = {"median": finite(float(np.median(xs))) if n else None, "lo": None, "hi": None, "coverage": None, "n": n}
    tail, k = 0.0, 0
    while n and k < n // 2:
        nxt = tail + math.comb(n, k) / 2 ** n  # P(Bin(n, 1/2) <= k) = P(< k + 1)
        if nxt > (1 - confidence) / 2:
            break
        tail, k = nxt, k + 1
    if k == 0:
        return out
    return {**out, "lo": finite(xs[k - 1]), "hi": finite(xs[n - k]), "coverage": 1 - 2 * tail}


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def interp(xs: Sequence[float], ys: Sequence[float], x: float) -> Optional[float]:
    """Piecewise-linear value of the curve (xs increasing) at x; None outside [xs[0], xs[-1]]."""
    if not xs or x < xs[0] - 1e-9 or x > xs[-1] + 1e-9:
        return None
    return float(np.interp(x, xs, ys))


def budget_to_reach(xs: Sequence[float], ys: Sequence[float], target: float) -> Optional[float]:
    """Smallest x at which the piecewise-linear curve first reaches `target`; None if it never does."""
    for i, (x, y) in enumerate(zip(xs, ys)):
        if y >= target:
            if i == 0:
                return float(x)
            x0, y0 = xs[i - 1], ys[i - 1]
            return float(x0 + (target - y0) * (x - x0) / (y - y0)) if y != y0 else float(x)
    return None


# ------------------------------------------------------------------------------------------------ runs
@dataclass
class Run:
    arm: str
    seed: int
    evals: list[dict]
    update_rows: int
    generated: int
    warm_start: dict = field(default_factory=dict)
    # The commit the run finished with (its summary's provenance; "A then B" for a run that continued one made at A);
    # None for runs made before it was recorded.
    commit: Optional[str] = None
    # `provenance.cpu_kind` of the machine that finished it; None for runs made before it was recorded.
    cpu_kind: Optional[str] = None

    @property
    def final(self) -> dict:
        return self.evals[-1]

    def curve(self, key: str) -> tuple[list[float], list[float]]:
        return [float(e["generated"]) for e in self.evals], [float(e[key]) for e in self.evals]

    def pass_at(self, ks: Sequence[int], which: int = -1) -> dict[int, float]:
        e = self.evals[which]
        n = int(e["n_samples"])
        ks = [k for k in ks if k <= n]
        return evaluate_correctness([(n, int(c)) for c in e["counts"]], ks)["pass@k"]


def load_run(arm: str, seed: int, run_dir: Path) -> Optional[Run]:
    """A finished run (summary.json present) or None."""
    run_dir = Path(run_dir)
    if not (run_dir / SUMMARY).exists():
        return None
    evals = jsonl.read(run_dir / EVALS)
    metrics = jsonl.read_metrics(run_dir / METRICS)
    summary = json.loads((run_dir / SUMMARY).read_text())
    warm = (summary.get("setup") or {}).get("warm_start") or {}
    warm = {k: warm.get(k) for k in ("pass_rate", "step", "stop_reason", "seconds", "cache_key", "n_params")}
    rows = sum(int(m.get("update_rows") or 0) for m in metrics)
    prov = summary.get("provenance") or {}
    kind = cpu_kind(prov) if "cpu" in prov else None
    commit, first = prov.get("commit"), continued_commit(run_dir)
    if first and commit and first != commit:  # a continued run: its first steps were made at another commit
        commit = f"{first} then {commit}"
    return Run(arm, seed, evals, rows, int(summary["generated_rollouts"]), warm, commit, kind)


# --------------------------------------------------------------------------------------- aggregation
@dataclass
class ArmStats:
    arm: str
    seeds: list[int]
    budgets: dict = field(default_factory=dict)   # budget -> {"acc_sampled": ci, "acc_greedy": ci, diffs ...}
    final: dict = field(default_factory=dict)     # metric -> ci (and "<metric>_diff" -> paired ci vs base)
    pass_at_k: dict = field(default_factory=dict)  # k -> ci; "diff" -> {k -> ci}
    reach: dict = field(default_factory=dict)     # rollouts to reach the base's final accuracy
    curve: dict = field(default_factory=dict)     # grid of generated -> acc_sampled/acc_greedy ci (for plots)


def choose_budgets(base_runs: list[Run], n: int) -> list[float]:
    """n evenly spaced evaluation points of the base arm (after step 0), the last one included."""
    pts = [float(e["generated"]) for e in base_runs[0].evals if e["generated"] > 0]
    if not pts:
        return []
    idx = sorted({int(round(i)) for i in np.linspace(0, len(pts) - 1, min(n, len(pts)))})
    return [pts[i] for i in idx]


def arm_stats(runs: list[Run], base: dict[int, Run], budgets: list[float], ks: Sequence[int], grid: Sequence[float]) -> ArmStats:
    """Everything the tables and plots need for one arm; `base` maps seed -> the base arm's run (paired)."""
    st = ArmStats(runs[0].arm, [r.seed for r in runs])
    paired = [(r, base.get(r.seed)) for r in runs]

    for b in budgets:
        row = {}
        for key in ("acc_sampled", "acc_greedy"):
            vals = [interp(*r.curve(key), b) for r in runs]
            diffs = [
                None if v is None or bb is None or interp(*bb.curve(key), b) is None else v - interp(*bb.curve(key), b)
                for v, (_, bb) in zip(vals, paired)
            ]
            row[key], row[key + "_diff"] = ci(vals), ci(diffs)
        st.budgets[b] = row

    def final_metric(name: str, f) -> None:
        st.final[name] = ci([f(r) for r in runs])

    for key in ("acc_sampled", "acc_greedy", "len_all", "len_correct", "len_incorrect"):
        final_metric(key, lambda r, key=key: r.final.get(key))
        st.final[key + "_diff"] = ci([_sub(r.final.get(key), bb.final.get(key)) if bb else None for r, bb in paired])
    for key in ("len_correct", "len_incorrect", "len_all"):
        st.final[key + "_rel"] = ci([relative_change(r.final.get(key), bb.final.get(key)) if bb else None for r, bb in paired])
    st.final["aes"] = ci([_aes(r, bb) for r, bb in paired])
    final_metric("generated", lambda r: float(r.generated))
    final_metric("update_rows", lambda r: float(r.update_rows))

    pk = [r.pass_at(ks) for r in runs]
    ks_here = sorted(set().union(*[set(p) for p in pk])) if pk else []
    st.pass_at_k = {k: ci([p.get(k) for p in pk]) for k in ks_here}
    st.pass_at_k["diff"] = {
        k: ci([_sub(p.get(k), bb.pass_at([k]).get(k)) if bb else None for p, (_, bb) in zip(pk, paired)]) for k in ks_here
    }

    # Generated rollouts to reach the base arm's final sampled accuracy (mean over its seeds).
    target = float(np.mean([bb.final["acc_sampled"] for bb in base.values()])) if base else float("nan")
    per_seed = [budget_to_reach(*r.curve("acc_sampled"), target) for r in runs]
    mean_curve = _mean_curve(runs, "acc_sampled")
    st.reach = {
        "target": target,
        "mean_curve": budget_to_reach(mean_curve[0], mean_curve[1], target) if mean_curve[0] else None,
        "per_seed": ci(per_seed),
        "reached": sum(v is not None for v in per_seed),
        "n": len(per_seed),
    }

    for key in ("acc_sampled", "acc_greedy"):
        st.curve[key] = [ci([interp(*r.curve(key), g) for r in runs]) for g in grid]
    st.curve["grid"] = list(grid)
    return st


def _mean_curve(runs: list[Run], key: str) -> tuple[list[float], list[float]]:
    """Seed-mean curve on the union of evaluation points (only where every seed's curve is defined)."""
    pts = sorted({x for r in runs for x in r.curve(key)[0]})
    xs, ys = [], []
    for x in pts:
        vals = [interp(*r.curve(key), x) for r in runs]
        if all(v is not None for v in vals):
            xs.append(x)
            ys.append(float(np.mean(vals)))
    return xs, ys


def _sub(a, b):
    return None if a is None or b is None else a - b


def _aes(r: Run, bb: Optional[Run]) -> Optional[float]:
    if bb is None:
        return None
    acc, base_acc = r.final["acc_sampled"], bb.final["acc_sampled"]
    length, base_len = r.final.get("len_all"), bb.final.get("len_all")
    if not base_acc or not base_len or length is None:
        return None
    return aes(acc, length, base_acc, base_len)


def curve_grid(runs: list[Run]) -> list[float]:
    """Common x grid for the curves: every evaluation point (generated rollouts) of any run."""
    return sorted({float(e["generated"]) for r in runs for e in r.evals})


def paired_ci(diffs: Sequence[Optional[float]]) -> dict:
    """`ci` of per-seed paired differences, plus "mde": their minimum detectable effect (`mde`; None if n < 2)."""
    c = ci(diffs)
    return {**c, "mde": mde(c["sd"], c["n"])}


def slope_ci(xs: Sequence[float], ys: Sequence[float], confidence: float = CONFIDENCE, power: float = POWER) -> dict:
    """Least-squares slope of ys on xs with its t-interval (df = n - 2) and minimum detectable slope,
    (t_{1-alpha/2,df} + t_{power,df}) x its standard error: {"mean" (the slope), "lo", "hi", "n", "se", "mde",
    "intercept"}. lo/hi/se/mde are None with fewer than 3 points or all xs equal (no spread to estimate)."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    n = len(x)
    none = {"mean": None, "lo": None, "hi": None, "n": n, "se": None, "mde": None, "intercept": None}
    if n < 2 or len(y) != n or float(np.ptp(x)) == 0.0:
        return none
    sxx = float(((x - x.mean()) ** 2).sum())
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    intercept = float(y.mean() - slope * x.mean())
    out = {**none, "mean": slope, "intercept": intercept}
    if n < 3:
        return out
    resid = y - (intercept + slope * x)
    se = math.sqrt(float((resid ** 2).sum()) / (n - 2) / sxx)
    half = t_quantile(n - 2, confidence) * se
    return {**out, "lo": slope - half, "hi": slope + half, "se": se, "mde": detectable(se, n - 2, confidence, power)}


def paired_diff(a: list[Run], b: list[Run], f) -> dict:
    """CI (and MDE, `paired_ci`) of f(run of a) - f(run of b) over the seeds both arms have."""
    bs = {r.seed: r for r in b}
    return paired_ci([_sub(f(r), f(bs[r.seed])) for r in a if r.seed in bs])
