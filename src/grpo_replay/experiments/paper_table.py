"""The paper's table from the benchmark stage: per-benchmark and mean accuracy (mean@n) with t-intervals over seeds,
pass@k, AES vs GRPO and lengths split by correctness, each paired by seed against GRPO.

Every number comes from the evaluation harness's per-benchmark rows (`grpo_replay.eval.harness.score_benchmark`),
averaged over benchmarks with its own `summarize` (the paper's unweighted mean), then over seeds with `stats.ci`.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..eval.metrics import aes, relative_change
from ..eval.harness import summarize
from .arms import BASE
from .final_eval import BenchSettings, load_results
from .jobs import RunSpec
from .markdown import table as _table
from .stats import Run, ci, format_ci, format_diff


@dataclass
class BenchRun:
    arm: str
    seed: int
    rows: dict[str, dict]  # benchmark label -> the harness's row
    mean: dict  # summarize(rows)


def load_bench_runs(specs: list[RunSpec], bs: BenchSettings) -> tuple[dict[str, list[BenchRun]], list[str]]:
    runs: dict[str, list[BenchRun]] = {}
    missing = []
    for s in specs:
        rows = load_results(s.run_dir, bs)
        if rows is None:
            missing.append(f"{s.arm}/seed{s.seed}")
        else:
            runs.setdefault(s.arm, []).append(BenchRun(s.arm, s.seed, rows, summarize(rows)))
    return runs, missing


def _sub(a, b):
    return None if a is None or b is None else a - b


def _aes(r: dict, b: dict) -> Optional[float]:
    try:
        return aes(r["mean@n"], r["length"]["all"], b["mean@n"], b["length"]["all"])
    except (ValueError, TypeError, KeyError):  # a zero or missing GRPO accuracy/length: AES undefined
        return None


def table_stats(runs: dict[str, list[BenchRun]], labels: list[str], ks: list[int]) -> dict[str, dict]:
    """Per arm: accuracy per benchmark and mean, pass@k, AES, lengths; each with the paired difference vs GRPO."""
    base = {r.seed: r for r in runs.get(BASE, [])}
    out = {}
    for arm, rs in runs.items():
        paired = [(r, base.get(r.seed)) for r in rs]
        st: dict[str, Any] = {"seeds": [r.seed for r in rs], "acc": {}, "acc_diff": {}, "pass@k": {}, "pass@k_diff": {}}
        for label in labels:
            st["acc"][label] = ci([r.rows[label]["mean@n"] for r in rs])
            st["acc_diff"][label] = ci([_sub(r.rows[label]["mean@n"], b.rows[label]["mean@n"]) if b else None for r, b in paired])
        st["acc"]["mean"] = ci([r.mean["mean@n"] for r in rs])
        st["acc_diff"]["mean"] = ci([_sub(r.mean["mean@n"], b.mean["mean@n"]) if b else None for r, b in paired])
        for k in ks:
            key = str(k)
            st["pass@k"][key] = ci([r.mean["pass@k"].get(key) for r in rs])
            st["pass@k_diff"][key] = ci([_sub(r.mean["pass@k"].get(key), b.mean["pass@k"].get(key)) if b else None for r, b in paired])
        for part in ("all", "correct", "incorrect"):
            st[f"len_{part}"] = ci([r.mean["length"][part] for r in rs])
            st[f"len_{part}_rel"] = ci([relative_change(r.mean["length"][part], b.mean["length"][part]) if b else None for r, b in paired])
        st["aes"] = ci([_aes(r.mean, b.mean) if b else None for r, b in paired])
        out[arm] = st
    return out


def claim_runs(runs: dict[str, list[BenchRun]]) -> dict[str, list[Run]]:
    """The benchmark means as `Run`s, so `claims.check_claims` judges the paper's claims on the benchmarks (the
    harness samples only: greedy accuracy is None there, and claims on it read 'not tested')."""
    out = {}
    for arm, rs in runs.items():
        out[arm] = [
            Run(arm, r.seed, [{
                "acc_sampled": r.mean["mean@n"], "acc_greedy": None, "len_all": r.mean["length"]["all"],
                "len_correct": r.mean["length"]["correct"], "len_incorrect": r.mean["length"]["incorrect"],
            }], 0, 0)
            for r in rs
        ]
    return out


# ------------------------------------------------------------------------------------------- formatting
def _len(c: dict) -> str:
    return "n/a" if not c or c.get("mean") is None else f"{c['mean']:.1f}"


def markdown(stats: dict[str, dict], arms: list[str], names: dict[str, str], bs: BenchSettings, missing: list[str]) -> str:
    labels = bs.labels()
    arms = [a for a in arms if a in stats]
    lim = f", first {bs.limit} problems of each" if bs.limit else ""
    lines = [
        "## The paper's table: final checkpoints on the benchmarks",
        "",
        f"Each run's final checkpoint evaluated by `grpo_replay.eval` on {', '.join(labels)}{lim}: n = {bs.n} samples "
        f"per problem (temperature {bs.temperature}, top-p {bs.top_p}, at most {bs.max_new_tokens} new tokens, "
        f"{bs.backend}), graded by math-verify. Accuracy = mean@n in %; 'mean' = the unweighted mean over the "
        "benchmarks (the paper's headline). Mean over seeds with a 95 % t-interval in brackets (none with one seed); "
        "Δ = paired (same-seed) difference vs GRPO in percentage points, * when its interval excludes 0.",
        "",
    ]
    if missing:
        lines += [f"**Runs without every benchmark result, left out of this table:** {', '.join(missing)}", ""]
    header = ["arm", "seeds"] + labels + ["mean", "Δ mean vs GRPO"]
    rows = [[names.get(a, a), str(len(stats[a]["seeds"]))] + [format_ci(stats[a]["acc"][l]) for l in labels]
            + [format_ci(stats[a]["acc"]["mean"]), format_diff(stats[a]["acc_diff"]["mean"]) if a != BASE else "–"] for a in arms]
    lines += ["Accuracy (%):", "", _table(header, rows), ""]
    header = ["arm"] + [f"Δ {l}" for l in labels]
    rows = [[names.get(a, a)] + [format_diff(stats[a]["acc_diff"][l]) for l in labels] for a in arms if a != BASE]
    if rows:
        lines += ["Per-benchmark paired difference vs GRPO (pp):", "", _table(header, rows), ""]
    ks = [str(k) for k in bs.ks]
    header = ["arm"] + [f"pass@{k}" for k in ks] + [f"Δ pass@{ks[-1]} vs GRPO"]
    rows = [[names.get(a, a)] + [format_ci(stats[a]["pass@k"][k]) for k in ks]
            + [format_diff(stats[a]["pass@k_diff"][ks[-1]]) if a != BASE else "–"] for a in arms]
    lines += ["pass@k (%, unbiased estimator, mean over benchmarks):", "", _table(header, rows), ""]
    header = ["arm", "AES vs GRPO", "len all", "len correct", "Δ % correct vs GRPO", "len incorrect", "Δ % incorrect vs GRPO"]
    rows = [[names.get(a, a), format_diff(stats[a]["aes"], scale=1.0, fmt="{:+.3f}") if a != BASE else "–", _len(stats[a]["len_all"]),
             _len(stats[a]["len_correct"]), format_diff(stats[a]["len_correct_rel"], unit=" %") if a != BASE else "–",
             _len(stats[a]["len_incorrect"]), format_diff(stats[a]["len_incorrect_rel"], unit=" %") if a != BASE else "–"] for a in arms]
    lines += [
        "Efficiency: AES (alpha 1, beta 3, gamma 5) from the mean accuracy and mean length of all completions, paired "
        "per seed vs GRPO; lengths are mean completion tokens (mean over benchmarks), split by correctness, with the "
        "paired relative change vs GRPO. (Paper at 4B: AES +0.579, correct +34.9 %, incorrect -10.2 %.)",
        "", _table(header, rows), "",
    ]
    return "\n".join(lines)


def write_csv(path: Path, stats: dict[str, dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arm", "metric", "benchmark", "mean", "ci_lo", "ci_hi", "n", "diff_vs_grpo", "diff_lo", "diff_hi"])
        for arm, st in stats.items():
            def row(metric, bench, c, d=None):
                d = d or {}
                w.writerow([arm, metric, bench, c.get("mean"), c.get("lo"), c.get("hi"), c.get("n"), d.get("mean"), d.get("lo"), d.get("hi")])

            for label, c in st["acc"].items():
                row("mean@n", label, c, st["acc_diff"][label])
            for k, c in st["pass@k"].items():
                row(f"pass@{k}", "mean", c, st["pass@k_diff"][k])
            for part in ("all", "correct", "incorrect"):
                row(f"len_{part}", "mean", st[f"len_{part}"])
                row(f"len_{part}_rel_vs_grpo", "mean", st[f"len_{part}_rel"])
            row("aes_vs_grpo", "mean", st["aes"])
