"""`grpo-replay compare`: the paper's comparisons and ablations over seeds, with confidence intervals.

Plans one training run per (arm, seed), runs the unfinished ones in parallel worker processes (finished runs are
skipped, interrupted ones resume), then writes tables (markdown), results.json / results.csv / runs.csv and PNG
plots. `--quick` is a seconds-scale setting for the test suite; the default (full) setting makes the report.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from .arms import COMPARISONS, PRIORITY_ORDER, SETTINGS, arms_for, make_arms


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="Tiny testbed, 2 seeds, a few arms: seconds (for tests).")
    p.add_argument("--out", default=None, help="Output directory for runs and results (default runs/compare-<setting>).")
    p.add_argument("--report-dir", default=None, help="Where report.md, the PNGs, JSON and CSV go (default <out>/report).")
    p.add_argument("--jobs", type=int, default=None, help="Parallel training processes (default: os.cpu_count()).")
    p.add_argument("--seeds", type=int, default=None, help="Seeds per arm (default: 2 quick, 5 full).")
    p.add_argument(
        "--comparisons", default=None,
        help=f"Comma-separated subset of {','.join(PRIORITY_ORDER)} (default: the setting's; alpha is scheduled last).",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="Extra TrainConfig override for every run (see `grpo-replay train --list-keys`).")
    p.add_argument("--report-to", "--report_to", nargs="+", default=None, metavar="TRACKER",
                   help="Experiment trackers for every run: none | tensorboard | wandb (several allowed).")
    p.add_argument("--cache-dir", default=None, help="Warm-start cache root (default: the testbed's; quick: <out>/testbed-cache).")
    p.add_argument("--report-only", action="store_true", help="Do not train; build the report from finished runs.")
    p.add_argument("--dry-run", action="store_true", help="Print the planned runs and exit.")
    p.add_argument("--no-progress", action="store_true", help="Print one line per finished run instead of a bar.")


def command_line(args: argparse.Namespace) -> str:
    """The invocation, rebuilt from the parsed arguments (so it is exact however `run` was called)."""
    parts = ["grpo-replay", "compare"]
    if args.quick:
        parts.append("--quick")
    for flag, name in (("--out", "out"), ("--report-dir", "report_dir"), ("--jobs", "jobs"), ("--seeds", "seeds"),
                       ("--comparisons", "comparisons"), ("--cache-dir", "cache_dir")):
        v = getattr(args, name)
        if v is not None:
            parts += [flag, str(v)]
    for item in args.set:
        parts += ["--set", item]
    if getattr(args, "report_to", None):
        parts += ["--report-to", *args.report_to]
    for flag, name in (("--report-only", "report_only"), ("--no-progress", "no_progress")):
        if getattr(args, name):
            parts.append(flag)
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    from .. import configio
    from .report import build_report
    from .runner import execute, plan

    setting = SETTINGS["quick" if args.quick else "full"]
    out = Path(args.out or f"runs/compare-{setting.name}")
    report_dir = Path(args.report_dir) if args.report_dir else out / "report"
    comparisons = tuple(setting.comparisons)
    if args.comparisons:
        comparisons = tuple(c.strip() for c in args.comparisons.split(",") if c.strip())
        bad = [c for c in comparisons if c not in COMPARISONS]
        if bad:
            print(f"grpo-replay compare: unknown comparison(s) {bad}; allowed: {', '.join(PRIORITY_ORDER)}", file=sys.stderr)
            return 2
        comparisons = tuple(c for c in PRIORITY_ORDER if c in comparisons)
    n_seeds = setting.seeds if args.seeds is None else args.seeds  # `or` would turn --seeds 0 into the default
    if n_seeds < 1:
        print("grpo-replay compare: --seeds must be >= 1", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print("grpo-replay compare: --jobs must be >= 1", file=sys.stderr)
        return 2
    jobs = args.jobs or os.cpu_count() or 1

    extra = {}
    try:
        for item in args.set:
            if "=" not in item:
                raise configio.ConfigError(f"--set {item!r}: expected KEY=VALUE")
            k, v = item.split("=", 1)
            extra[k.strip()] = configio.parse_value(v)
        if getattr(args, "report_to", None):
            extra["report_to"] = args.report_to
        base_overrides = {**setting.overrides, **extra}
        cache_dir = args.cache_dir or (str(out / "testbed-cache") if setting.cache_in_out else None)
        arms = make_arms(setting.__class__(**{**setting.__dict__, "overrides": base_overrides}))
        names = arms_for(comparisons, setting.only_arms)
        specs = plan([arms[n] for n in names], list(range(n_seeds)), base_overrides, out, cache_dir)
    except configio.ConfigError as e:
        print(f"grpo-replay compare: config error: {e}", file=sys.stderr)
        return 2

    if args.dry_run:
        for s in specs:
            print(f"{'done' if s.done else 'todo'}  {s.arm:<13} seed {s.seed}  {s.run_dir}")
        print(f"{len(specs)} runs ({sum(s.done for s in specs)} finished); comparisons: {', '.join(comparisons)}")
        return 0

    info = {"runs": len(specs), "ran": 0, "skipped": len(specs), "jobs": jobs, "wall_s": 0.0, "failed": []}
    if not args.report_only:
        res = execute(specs, jobs, progress=not args.no_progress)
        info.update(res)
    results = build_report(specs, arms, setting, list(comparisons), report_dir, command_line(args), extra, info)
    print(f"grpo-replay compare: report in {report_dir / 'report.md'}")
    for c in results.get("claims", []):
        print(f"  {c['claim']}: {c['verdict']}")
    if info["failed"]:
        print(f"grpo-replay compare: {len(info['failed'])} run(s) failed:", file=sys.stderr)
        for f in info["failed"]:
            print(f"  {f['arm']} seed {f['seed']} ({f['run_dir']}): {f['error'].splitlines()[0]}", file=sys.stderr)
        return 1
    if results.get("missing_runs"):
        return 1 if not args.report_only else 0
    return 0
