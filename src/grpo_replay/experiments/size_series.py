"""`grpo-replay compare --size-series`: does replay's gain over GRPO grow with model size?

The paper reports larger gains for larger models. On the testbed the question is asked of three widths of the tiny
model (`SIZE_SERIES`: `small` 0.11M, `default` 0.43M, `large` 1.71M parameters), each with its own supervised warm
start into the same pass-rate window (the default's 10-25 %), so every size starts RL at a similar accuracy. Each
size is one ordinary `compare` (its own report, with the command that makes it alone), over the same seeds and arms
(GRPO and the paper's method by default). The series report then puts the per-size paired gains side by side and
tests the trend: the least-squares slope of the per-seed gain on log4(parameters), i.e. the change of the gain per
4x parameters, with its 95 % t-interval and minimum detectable effect.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from ..errors import UsageError
from ..app.provenance import describe, provenance, run_commits_line
from ..tasks.testbed.testbed_config import SIZE_SERIES, TestbedConfig
from . import claims
from .arms import BASE
from .stats import CONFIDENCE, POWER, ci, format_ci, paired_ci, slope_ci

#: The flags a series fixes itself (each size is the main comparison on one named testbed).
_FIXED = (("--quick", "quick"), ("--testbed", "testbed"), ("--comparisons", "comparisons"), ("--model", "model"))
CLAIM = "Replay's gain over GRPO grows with model size"


def n_params(size: str) -> int:
    """Parameters of the size's model (tied embeddings counted once), built from its config in well under 1 s."""
    from ..tasks.testbed.model import build_model, n_params as count
    from ..tasks.testbed.tokenizer import build_tokenizer

    return count(build_model(TestbedConfig.named(size), build_tokenizer()))


def run(args: argparse.Namespace, run_compare: Callable[[argparse.Namespace], int], command: str) -> int:
    """Run (or resume) one `compare` per size (`run_compare`), then write the series report, headed by `command`.
    Returns the worst exit status."""
    set_keys = {item.split("=", 1)[0].strip() for item in (args.set or [])}
    for flag, name in (*_FIXED, ("--set testbed_preset=...", "testbed_preset")):
        if getattr(args, name, None) or (name == "testbed_preset" and name in set_keys):
            raise UsageError(f"--size-series runs the main comparison on each named size ({', '.join(SIZE_SERIES)}); "
                             f"it cannot go with {flag}")
    out = Path(args.out or "runs/compare-size-series")
    if args.dry_run:
        return _run_sizes(args, run_compare, out, command)
    from ..trainer.rundir import exclusive

    # Each size's compare locks out/<size>; this keeps a second series from interleaving with the first.
    with exclusive(out, ".grpo-replay-size-series.lock", "grpo-replay compare --size-series"):
        return _run_sizes(args, run_compare, out, command)


def _run_sizes(args: argparse.Namespace, run_compare: Callable[[argparse.Namespace], int], out: Path, command: str) -> int:
    report_dir = Path(args.report_dir) if args.report_dir else out / "report"
    rc = 0
    for size in SIZE_SERIES:
        sub = argparse.Namespace(**vars(args))
        sub.size_series = False
        sub.testbed = size
        sub.comparisons = "main"
        sub.arms = args.arms or "paper"
        sub.out = str(out / size)
        sub.report_dir = str(report_dir / size)
        print(f"grpo-replay compare --size-series: size {size}", file=sys.stderr, flush=True)
        # Bad input (a flag, a --set key) is the same for every size: the first size's UsageError stops the series.
        rc = max(rc, run_compare(sub))
    if args.dry_run:
        return rc

    series = build_series_report(report_dir, command, args.arms or "paper")
    print(f"grpo-replay compare: size-series report in {report_dir / 'report.md'}")
    print(f"  {CLAIM}: {series['claim']['verdict']}")
    return rc


def _final_acc(size_dir: Path) -> dict[str, dict[int, float]]:
    """{arm: {seed: final sampled accuracy}} from a size's runs.csv (the numbers its own report used)."""
    out: dict[str, dict[int, float]] = {}
    path = size_dir / "runs.csv"
    if not path.is_file():
        return out
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["acc_sampled"] not in ("", "None"):
                out.setdefault(row["arm"], {})[int(row["seed"])] = float(row["acc_sampled"])
    return out


def build_series_report(report_dir: Path, command: str, arms: str = "paper") -> dict[str, Any]:
    """Read each size's report (`<report_dir>/<size>/runs.csv`, `results.json`); write report.md, size_series.json,
    size_series.csv and gain_vs_size.png into report_dir. The arm compared with GRPO is the first of `arms`."""
    arm = [a.strip() for a in arms.split(",") if a.strip() and a.strip() != BASE][0]
    rows, xs, ys = [], [], []
    for size in SIZE_SERIES:
        acc = _final_acc(report_dir / size)
        res_path = report_dir / size / "results.json"
        res = json.loads(res_path.read_text()) if res_path.is_file() else {}
        warms = list((res.get("warm_starts") or {}).values())
        warm = [w.get("pass_rate") for w in warms if w.get("pass_rate") is not None]
        # The runs' own count (a --set testbed.* override may change the width); the named config's otherwise.
        p = next((int(w["n_params"]) for w in warms if w.get("n_params")), None) or n_params(size)
        base, other = acc.get(BASE, {}), acc.get(arm, {})
        seeds = sorted(set(base) & set(other))
        gains = [other[s] - base[s] for s in seeds]
        rows.append({
            "size": size, "n_params": p, "seeds": seeds,
            "warm_start_pass_rate": {"mean": sum(warm) / len(warm) if warm else None,
                                     "min": min(warm, default=None), "max": max(warm, default=None)},
            "grpo": ci([base[s] for s in seeds]), arm: ci([other[s] for s in seeds]),
            "gain": paired_ci(gains), "gain_per_seed": dict(zip(seeds, gains)),
            "acc_per_seed": {s: (base[s], other[s]) for s in seeds},
            "provenance": res.get("provenance"), "run_commits": res.get("run_commits") or {},
            "command": res.get("command"),
        })
        xs += [math.log(p, 4)] * len(gains)
        ys += gains
    trend = slope_ci(xs, ys)
    verdict = claims.verdict(trend)
    result = {
        "command": command, "arm": arm, "confidence": CONFIDENCE, "power": POWER, "provenance": provenance(),
        "run_commits": dict(sum((Counter(r.get("run_commits") or {}) for r in rows), Counter())),
        "sizes": rows, "trend": trend,
        "claim": {"claim": CLAIM, "verdict": verdict,
                  "evidence": f"slope of the paired gain per 4x parameters: {format_ci(trend, fmt='{:+.2f}', unit=' pp', n=True, show_mde=True)}"},
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "size_series.json").write_text(json.dumps(result, indent=1, default=str))
    with open(report_dir / "size_series.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["size", "n_params", "seed", "grpo_acc", f"{arm}_acc", "gain"])
        for r in rows:
            for s, (b, o) in r["acc_per_seed"].items():
                w.writerow([r["size"], r["n_params"], s, b, o, o - b])
    from ..plotting.comparison import gain_vs_size

    png = gain_vs_size(rows, trend, arm, report_dir / "gain_vs_size.png")
    (report_dir / "report.md").write_text(_markdown(result, png.name))
    return result


def _markdown(result: dict, png: str) -> str:
    arm, rows = result["arm"], result["sizes"]
    pp = lambda c: format_ci(c, fmt="{:.1f}")  # noqa: E731
    made = run_commits_line(result.get("run_commits") or {}, result["provenance"].get("commit"))
    lines = [
        "# grpo-replay compare: model-size series (does replay's gain grow with model size?)", "",
        "Made by:", "", "```", result["command"], "```", "",
        "Each size is its own `compare` of GRPO and the paper's method on the embedded testbed at one model width "
        "(depth 2, MLP 3x the width), with its own warm start per seed into the same pass-rate window (10-25 % sampled); "
        f"its report, with the command that makes it alone, is in `<size>/report.md`. Code: {describe(result['provenance'])}."
        + (f" {made}" if made else ""), "",
        f"| size | parameters | warm-start pass@1 (mean [min, max] over seeds) | GRPO final (%) | {arm} final (%) | "
        f"{arm} - GRPO (pp, paired) |",
        "|---|---:|---|---|---|---|",
    ]
    for r in rows:
        w = r["warm_start_pass_rate"]
        ws = "n/a" if w["mean"] is None else f"{100 * w['mean']:.1f} [{100 * w['min']:.1f}, {100 * w['max']:.1f}]"
        lines.append(f"| {r['size']} | {r['n_params'] / 1e6:.2f}M | {ws} | {pp(r['grpo'])} | {pp(r[arm])} | "
                     f"{claims.pp(r['gain'])} |")
    c = result["claim"]
    lines += [
        "", "## The claim", "",
        "| claim | verdict | evidence |", "|---|---|---|",
        f"| {c['claim']} | **{c['verdict']}** | {c['evidence']} |", "",
        "The trend is the least-squares slope of each seed's paired gain (final held-out sampled accuracy, the paper's "
        "method minus GRPO, same seed) on log4(parameters): the change of the gain per 4x parameters, with a two-sided "
        f"{int(100 * result['confidence'])} % t-interval (df = points - 2) and the minimum detectable slope at "
        f"{int(100 * result['power'])} % power, (t_0.975,df + t_0.80,df) x its standard error. Verdicts as in the other "
        "reports: *holds* = positive slope whose CI excludes 0; *direction agrees, not significant* = positive, CI "
        "includes 0; *does not hold* = zero or negative.", "",
        f"![gain vs size]({png})", "",
        "Files: size_series.json (everything above), size_series.csv (one row per size and seed), "
        "`<size>/` (each size's full compare report).", "",
    ]
    return "\n".join(lines)


__all__ = ["run", "build_series_report", "n_params", "CLAIM"]
