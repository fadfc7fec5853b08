"""`grpo-replay compare`: the paper's comparisons and ablations over seeds, with confidence intervals.

Plans one training run per (arm, seed), runs the unfinished ones in parallel worker processes (finished runs are
skipped, interrupted ones resume), then writes tables (markdown), results.json / results.csv / runs.csv and PNG
plots. `--quick` is a seconds-scale setting for the test suite; the default (full) setting makes the report.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, NamedTuple
import shlex
import sys
from pathlib import Path

from ..app.configio import int_arg, nonempty, once, path_arg
from ..app.data import BENCHMARKS
from ..errors import ConfigError, InputNotFound, UsageError
from ..tasks.testbed.testbed_config import TESTBED_PRESETS
from ..experiments.arms import BASE, COMPARISONS, PRIORITY_ORDER, REAL, SETTINGS, arms_for, make_arms
from ..experiments.final_eval import BenchSettings, evaluate_all, missing_benchmarks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="Tiny testbed, 2 seeds, a few arms: seconds (for tests).")
    p.add_argument("--out", action=once(), type=path_arg, default=None, help="Output directory for runs and results (default runs/compare-<setting>).")
    p.add_argument("--report-dir", action=once(), type=path_arg, default=None, help="Where report.md, the PNGs, JSON and CSV go (default <out>/report).")
    p.add_argument("--jobs", action=once(), type=int_arg, default=None, help="Parallel training processes (default: os.cpu_count()).")
    p.add_argument("--seeds", action=once(), type=int_arg, default=None, help="Seeds per arm (default: 2 quick, 5 full).")
    p.add_argument("--first-seed", action=once(), type=int_arg, default=None,
                   help="Seeds are FIRST..FIRST+SEEDS-1 (default 0): pilot seeds kept apart from a report's seeds.")
    p.add_argument("--testbed", action=once(), choices=TESTBED_PRESETS, default=None,
                   help="Named embedded testbed for every run (TrainConfig.testbed_preset; docs/testbed.md): default | "
                        "reasoning (running partial sums, 10-40-token completions) | small | large (the default task "
                        "on a 0.11M / 1.71M-parameter model); full setting only.")
    p.add_argument(
        "--comparisons", action=once(), type=nonempty, default=None,
        help=f"Comma-separated subset of {','.join(PRIORITY_ORDER)} (default: the setting's; alpha is scheduled last).",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="Extra TrainConfig override for every run (see `grpo-replay train --list-keys`).")
    p.add_argument("--report-to", "--report_to", action=once(), nargs="+", default=None, metavar="TRACKER",
                   help="Experiment trackers for every run: none | tensorboard | wandb | trackio (several allowed).")
    p.add_argument("--cache-dir", action=once(), type=path_arg, default=None, help="Warm-start cache root (default: the testbed's; quick: <out>/testbed-cache).")
    p.add_argument("--report-only", action="store_true", help="Do not train; build the report from finished runs.")
    p.add_argument("--dry-run", action="store_true", help="Print the planned runs and exit.")
    p.add_argument("--no-progress", action="store_true", help="Print one line per finished run instead of a bar.")
    p.add_argument("--size-series", action="store_true",
                   help="The model-size series: the main comparison (grpo and --arms, default paper) on each of the "
                        "testbeds small, default, large (0.11M / 0.43M / 1.71M parameters), then a report of the gain "
                        "by size (default --out runs/compare-size-series).")
    p.add_argument("--arms", action=once(), type=nonempty, default=None, help="Comma-separated arms to run (grpo, the base, is always added); "
                   "default: every arm of the comparisons.")
    g = p.add_argument_group(
        "real model: train every arm and seed, then evaluate each final checkpoint on the benchmarks (the paper's table)")
    g.add_argument("--model", action=once(), type=nonempty, default=None, help="Causal LM to train: local directory, hub id or .gguf file (turns on this mode).")
    g.add_argument("--model-file", action=once(), type=nonempty, default=None, help="A GGUF file (NAME.gguf) inside the --model directory.")
    g.add_argument("--data", action=once(), type=nonempty, default=None, help="Training prompts: JSONL file, directory, dataset name, or word_sums.")
    g.add_argument("--reward", action=once(), default=None, help="Reward: math (the only one for a real model; default with --model).")
    g.add_argument("--backend", action=once(), default=None, help="Trainer: builtin (default) or trl. verl: see docs/paper_table.md.")
    g.add_argument("--benchmarks", action=once(), type=nonempty, default=None, help=f"Comma-separated benchmarks (default {','.join(BENCHMARKS)}).")
    g.add_argument("--data-dir", action=once(), type=path_arg, default=None, help="Benchmark directory (default $GRPO_REPLAY_DATA).")
    g.add_argument("--eval-n", action=once(), type=int_arg, default=16, help="Samples per benchmark problem (default 16).")
    g.add_argument("--eval-k", action=once(), default=None, help="pass@k values, comma-separated (default powers of 2 up to --eval-n).")
    g.add_argument("--eval-temperature", action=once(), type=float, default=0.6)
    g.add_argument("--eval-top-p", action=once(), type=float, default=0.95)
    g.add_argument("--eval-max-new-tokens", action=once(), type=int_arg, default=4096)
    g.add_argument("--eval-limit", action=once(), type=int_arg, default=None, help="At most N problems per benchmark.")
    g.add_argument("--eval-backend", action=once(), default="transformers", help="transformers (default) or vllm (GPU).")
    g.add_argument("--eval-batch-size", action=once(), type=int_arg, default=8, help="Problems per generation call.")
    g.add_argument("--eval-device", action=once(), default="auto", help="auto | cpu | cuda[:i] (transformers backend).")
    g.add_argument("--keep-checkpoints", action="store_true",
                   help="Keep each run's final checkpoint after its evaluation (default: deleted once every benchmark is done).")


def command_line(args: argparse.Namespace) -> str:
    """The invocation, rebuilt from the parsed arguments (so it is exact however `run` was called)."""
    parts = ["grpo-replay", "compare"]
    if args.quick:
        parts.append("--quick")
    if getattr(args, "size_series", False):
        parts.append("--size-series")
    for flag, name in (("--out", "out"), ("--report-dir", "report_dir"), ("--jobs", "jobs"), ("--seeds", "seeds"),
                       ("--first-seed", "first_seed"), ("--testbed", "testbed"), ("--comparisons", "comparisons"), ("--cache-dir", "cache_dir")):
        v = getattr(args, name, None)
        if v is not None:
            parts += [flag, str(v)]
    for item in args.set:
        parts += ["--set", item]
    if getattr(args, "report_to", None):
        parts += ["--report-to", *args.report_to]
    for flag, name in (("--arms", "arms"), ("--model", "model"), ("--model-file", "model_file"), ("--data", "data"),
                       ("--reward", "reward"), ("--backend", "backend"), ("--benchmarks", "benchmarks"),
                       ("--data-dir", "data_dir"), ("--eval-k", "eval_k"), ("--eval-limit", "eval_limit")):
        v = getattr(args, name, None)
        if v is not None:
            parts += [flag, str(v)]
    if getattr(args, "model", None) is not None:
        for flag, name in (("--eval-n", "eval_n"), ("--eval-temperature", "eval_temperature"), ("--eval-top-p", "eval_top_p"),
                           ("--eval-max-new-tokens", "eval_max_new_tokens"), ("--eval-backend", "eval_backend")):
            parts += [flag, str(getattr(args, name))]
    for flag, name in (("--keep-checkpoints", "keep_checkpoints"),):
        if getattr(args, name, False):
            parts.append(flag)
    for flag, name in (("--report-only", "report_only"), ("--no-progress", "no_progress")):
        if getattr(args, name):
            parts.append(flag)
    return shlex.join(parts)


COMPARE_LOCK = ".grpo-replay-compare.lock"
# (flag, argparse dest, config key) of compare's flags that set a training config key.
_KEYED_FLAGS = (("--report-to", "report_to", "report_to"), ("--testbed", "testbed", "testbed_preset"),
                ("--backend", "backend", "backend"), ("--model", "model", "model"), ("--model-file", "model_file", "model_file"),
                ("--data", "data", "data"), ("--reward", "reward", "reward"))


class Plan(NamedTuple):
    """What a `compare` command line runs, resolved (`planned`)."""

    specs: list  # one RunSpec per (arm, seed)
    arms: dict
    setting: Any
    comparisons: tuple
    bench: Any  # BenchSettings of the benchmark stage (real-model mode), else None
    seeds: list
    jobs: int
    out: Path
    report_dir: Path
    extra: dict  # the --set overrides every run takes


def planned(args: argparse.Namespace) -> Plan:
    """What the command would run, resolved as `run` resolves it; UsageError for a flag or --set it cannot
    apply."""
    setting = SETTINGS["quick" if args.quick else "full"]
    testbed = getattr(args, "testbed", None) or "default"
    if testbed != "default" and getattr(args, "model", None) is not None:
        raise UsageError(f"--testbed {testbed} is the embedded testbed; it cannot go with --model")
    setting, bench = _real_mode(args, setting)
    out = Path(args.out or (f"runs/compare-{setting.name}" + (f"-{testbed}" if testbed != "default" else "")))
    report_dir = Path(args.report_dir) if args.report_dir else out / "report"
    comparisons = tuple(setting.comparisons)
    if args.comparisons:
        comparisons = tuple(c.strip() for c in args.comparisons.split(",") if c.strip())
        bad = [c for c in comparisons if c not in COMPARISONS]
        if bad:
            raise UsageError(f"unknown comparison(s) {bad}; allowed: {', '.join(PRIORITY_ORDER)}")
        comparisons = tuple(c for c in PRIORITY_ORDER if c in comparisons)
        setting = setting.for_comparisons(True)  # a comparison named runs its arms, with --quick too
    seeds, jobs = _seeds_and_jobs(args, setting)
    specs, arms, extra = _plan(args, setting, testbed, comparisons, seeds, out)
    return Plan(specs, arms, setting, comparisons, bench, seeds, jobs, out, report_dir, extra)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "size_series", False):
        from ..experiments import size_series

        return size_series.run(args, run, command_line(args))
    specs, arms, setting, comparisons, bench, seeds, jobs, out, report_dir, extra = planned(args)

    if args.dry_run:
        for s in specs:
            todo_b = f"  benchmarks to evaluate: {','.join(missing_benchmarks(s.run_dir, bench)) or 'none'}" if bench else ""
            print(f"{'done' if s.done else 'todo'}  {s.arm:<13} seed {s.seed}  {s.run_dir}{todo_b}")
        print(f"{len(specs)} runs ({sum(s.done for s in specs)} finished); comparisons: {', '.join(comparisons)}")
        return 0

    from ..trainer.rundir import exclusive

    # Two compares into one --out would race for the same runs (each run is locked, so the loser's runs fail) and
    # write one report over the other; the second is refused up front instead.
    with exclusive(out, COMPARE_LOCK, "grpo-replay compare"):  # another compare holding it: RunDirError, exit 2
        return _run_and_report(args, specs, arms, setting, comparisons, report_dir, extra, jobs, bench)


def _plan(args: argparse.Namespace, setting, testbed: str, comparisons: tuple[str, ...], seeds: list[int], out: Path):
    """(specs, arms, extra): the planned runs, the arms by name and the --set overrides every run takes. Raises
    ConfigError for a --set or flag that compare cannot apply to every run."""
    from ..app import configio
    from ..experiments.jobs import plan

    # The flags compare maps onto config keys, so a --set of the same key is refused as in train.
    given = {key: configio.as_given(flag, v) for flag, name, key in _KEYED_FLAGS if (v := getattr(args, name, None)) is not None}
    extra = configio.parse_sets(args.set, given)
    from ..trainer.train_config import FIELDS

    # Typed now (1e3 -> 1000): the arms and the plan read steps and prompts_per_step before any run resolves them.
    extra = {k: configio.check_value(k, v, FIELDS[k][0]) if k in FIELDS else v for k, v in extra.items()}
    if getattr(args, "report_to", None):
        extra["report_to"] = args.report_to
    if testbed != "default":
        extra["testbed_preset"] = testbed
    if setting.name == "quick" and extra.get("testbed_preset", "default") != "default":
        # QUICK's tiny addition testbed (testbed.digits_max, .difficulty_weights, ...) cannot describe another task.
        raise ConfigError(
            f"testbed_preset={extra['testbed_preset']!r} is invalid with --quick, which runs the tiny addition testbed; "
            "allowed with --quick: default. Drop --quick (the full setting) and give small budgets with --set steps=...")
    base_overrides = {**setting.overrides, **extra}
    cache_dir = args.cache_dir or (str(out / "testbed-cache") if setting.cache_in_out else None)
    if cache_dir:  # absolute in every run's config.yaml, which may be reused from another directory
        cache_dir = str(Path(cache_dir).expanduser().absolute())
    arms = make_arms(setting.__class__(**{**setting.__dict__, "overrides": base_overrides}))
    names = _arm_names(args.arms, comparisons, setting, arms)
    _refuse_per_run_sets(set(configio.parse_sets(args.set)), [arms[n] for n in names], cache_dir)
    specs = plan([arms[n] for n in names], seeds, base_overrides, out, cache_dir)
    return specs, arms, extra


def _run_and_report(args, specs, arms, setting, comparisons, report_dir, extra, jobs, bench) -> int:
    from ..experiments.report import build_report
    from ..experiments.jobs import execute

    info = {"runs": len(specs), "ran": 0, "skipped": len(specs), "jobs": jobs, "wall_s": 0.0, "failed": []}
    if not args.report_only:
        res = execute(specs, jobs, progress=not args.no_progress)
        info.update(res)
        if bench is not None:  # the benchmark stage: every finished run's final checkpoint
            ev = evaluate_all(specs, bench, jobs, log=lambda m: print(m, file=sys.stderr, flush=True))
            info["eval"] = {k: v for k, v in ev.items() if k != "failed"}
            info["failed"] = list(info["failed"]) + [{**f, "error": "evaluation: " + f["error"]} for f in ev["failed"]]
    results = build_report(specs, arms, setting, list(comparisons), report_dir, command_line(args), extra, info, bench=bench)
    print(f"grpo-replay compare: report in {report_dir / 'report.md'}")
    for c in results.get("claims", []):
        print(f"  {c['claim']}: {c['verdict']}")
    if info["failed"]:
        print(f"grpo-replay compare: {len(info['failed'])} run(s) failed:", file=sys.stderr)
        for f in info["failed"]:
            print(f"  {f['arm']} seed {f['seed']} ({f['run_dir']}): {f['error'].splitlines()[0]}", file=sys.stderr)
        return 1
    if results.get("missing_runs") or (results.get("paper_table") or {}).get("missing_runs"):
        return 1 if not args.report_only else 0
    return 0


def _refuse_per_run_sets(keys: set[str], arms: list, cache_dir) -> None:
    """A --set of a key that compare sets per run would be dropped from every run (or from some arms) while the
    report records it: refused, naming what sets it. An arm's own schedule (a key a resume may change, e.g. the
    DAPO arms' eval_every) only evaluates or checkpoints at other steps; over it the --set is kept for the other
    arms, and a note says so."""
    from ..experiments.arms import seed_overrides
    from ..trainer.rundir import RESUMABLE_KEYS
    from ..trainer.train_config import preset_fields

    setters = {k: "--first-seed and --seeds (each run's seed)" for k in seed_overrides(0)}
    setters.update({"out_dir": "--out (each run has its own directory under it)", "progress": "--no-progress"})
    if cache_dir:
        setters["testbed.cache_dir"] = "--cache-dir"
    schedule: dict[str, list[str]] = {}
    for arm in arms:
        for k in arm.overrides:
            if k == "prompts_per_step" and not arm.same_budget:
                continue  # the compute-matched arm scales the setting's prompts_per_step, --set included
            if k in RESUMABLE_KEYS and k not in setters:
                schedule.setdefault(k, []).append(f"{arm.name} ({k}={arm.overrides[k]})")
                continue
            what = f"the arm {arm.name!r} (choose arms with --arms or --comparisons)"
            setters.setdefault(k, what)
            for field in preset_fields().get(k, ()):
                setters.setdefault(field, f"the preset of {what}")
    for k in sorted(keys & set(setters)):
        raise ConfigError(f"--set {k}=... is set per run by {setters[k]}; compare cannot apply it to every "
                                   "run, so it is refused")
    for k in sorted(keys & set(schedule)):
        print(f"grpo-replay compare: note: --set {k} applies to every arm but {', '.join(schedule[k])}, which keep "
              "their own", file=sys.stderr)


def _seeds_and_jobs(args: argparse.Namespace, setting) -> tuple[list[int], int]:
    """The seeds (--first-seed .. + --seeds - 1) and the parallel jobs; UsageError naming a bad flag."""
    n_seeds = setting.seeds if args.seeds is None else args.seeds  # `or` would turn --seeds 0 into the default
    if n_seeds < 1:
        raise UsageError("--seeds must be >= 1")
    first_seed = getattr(args, "first_seed", None) or 0
    if first_seed < 0:
        raise UsageError(f"--first-seed={first_seed} is invalid; allowed: an integer >= 0")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be >= 1")
    return list(range(first_seed, first_seed + n_seeds)), args.jobs or os.cpu_count() or 1


def _real_mode(args: argparse.Namespace, setting):
    """(setting, BenchSettings) for `--model` (the real-model setting plus the benchmark stage); else (setting, None).
    Raises UsageError naming the flag and its allowed values."""
    from dataclasses import replace

    model = getattr(args, "model", None)
    if model is None:
        for flag, name in (("--model-file", "model_file"), ("--data", "data"), ("--benchmarks", "benchmarks"), ("--eval-limit", "eval_limit")):
            if getattr(args, name, None) is not None:
                raise UsageError(f"{flag} is for a real model; give --model too (without it compare runs the embedded testbed)")
        if getattr(args, "reward", None) not in (None, "testbed"):
            raise UsageError(f"--reward {args.reward!r} needs --model; the embedded testbed uses its own reward")
        if getattr(args, "backend", None) is not None:
            setting = replace(setting, overrides={**setting.overrides, "backend": args.backend})
        return setting, None
    if args.quick:
        raise UsageError("--quick is the embedded testbed; with --model set small budgets with --set (steps=..., ...)")
    if (args.reward or "math") != "math":
        raise UsageError(f"--reward {args.reward!r} is invalid with --model; allowed: math")
    if not args.data:
        raise UsageError("--model needs --data: the training prompts (a JSONL file, a directory, a dataset name, or word_sums)")
    from ..app.models import resolve_model

    resolve_model(model, args.model_file, field="--model", file_field="--model-file")  # a missing file fails now
    if model.startswith((".", "/", "~")) or model.count("/") > 1:  # a local path, not a hub id "org/name"
        if not os.path.exists(os.path.expanduser(model)):
            raise InputNotFound(f"--model {model}: path does not exist")
    backend = args.backend or "builtin"
    from ..trainer.train_config import BACKENDS

    if backend not in BACKENDS:
        raise UsageError(
            f"--backend {backend!r} is invalid; allowed: {', '.join(BACKENDS)} (verl: one launch per arm, see docs/paper_table.md)"
        )
    ov = {**REAL.overrides, "model": model, "data": args.data, "backend": backend}
    if args.model_file:
        ov["model_file"] = args.model_file
    benchmarks = tuple(b.strip() for b in (args.benchmarks or ",".join(BENCHMARKS)).split(",") if b.strip())
    try:
        ks = tuple(int(k) for k in args.eval_k.split(",") if k.strip()) if args.eval_k else tuple(
            k for k in (1, 2, 4, 8, 16, 32, 64) if k <= args.eval_n)
    except ValueError:
        raise UsageError(f"--eval-k {args.eval_k!r} is invalid; allowed: comma-separated integers 1 <= k <= --eval-n") from None
    bench = BenchSettings(
        benchmarks=benchmarks, n=args.eval_n, ks=ks, temperature=args.eval_temperature, top_p=args.eval_top_p,
        max_new_tokens=args.eval_max_new_tokens, limit=args.eval_limit, data_dir=args.data_dir, backend=args.eval_backend,
        batch_size=args.eval_batch_size, device=args.eval_device, keep_checkpoints=args.keep_checkpoints,
    )
    from ..eval.harness import load_benchmark

    for b in benchmarks:  # a missing benchmark file fails now, not after hours of training
        if not load_benchmark(b, args.data_dir, 1):
            raise UsageError(f"--benchmarks: {b} has no problems")
    return replace(REAL, overrides=ov), bench


def _arm_names(arms_arg, comparisons, setting, arms: dict) -> list[str]:
    """The arms to run: --arms (grpo always first) or every arm of the comparisons."""
    if not arms_arg:
        return arms_for(comparisons, setting.only_arms)
    want = [a.strip() for a in arms_arg.split(",") if a.strip()]
    bad = [a for a in want if a not in arms]
    if bad:
        raise ConfigError(f"--arms: unknown arm(s) {bad}; allowed: {', '.join(arms)}")
    return [BASE] + [a for a in dict.fromkeys(want) if a != BASE]
