"""The preflight of a `grpo-replay compare` plan: every (arm, seed) run as `compare` resolves it, then the
benchmark stage. Memory and the replay share are reported once per arm (its seeds share the shapes); seeds,
run directories and their resume state per run."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..trainer.rundir import RunDir
from ..trainer.train_config import resolve
from .host import Host, check_stack
from .report import Report
from .train_run import check_data, check_launch_rules, check_memory, check_replay, check_run_dir, on_gpu

# What a run's seed changes (experiments.arms.seed_overrides): it must differ between the seeds of one arm.
SEEDED = ("seed", "testbed.seed")
# The keys the memory estimate reads (trainer/memory.run_phases): arms equal in these share one estimate.
MEMORY_KEYS = ("model", "prompts_per_step", "group_size", "micro_batch_size", "max_new_tokens", "generator", "backend",
               "eval_problems", "eval_samples", "precision", "device", "reward", "replay.replay_ratio",
               "replay.composition", "replay.fill_filtered")


def check_compare(plan, host: Host, gpu_memory: Optional[int], launch: str) -> Report:
    report = Report(launch)
    cfgs = [(spec, resolve(spec.overrides)) for spec in plan.specs]
    gpu = any(on_gpu(cfg, host, gpu_memory) for _, cfg in cfgs)
    if gpu:
        check_stack(host, "main", True, 1, report)
        if plan.jobs > 1:
            report.refuse("--jobs", f"{plan.jobs} runs at once, each on the default CUDA device and most of a card",
                          "--jobs 1")
    else:
        report.add("software", f"torch {host.torch} (installed here); the runs use the CPU")
    report.add("runs", f"{len(plan.specs)} runs: arms {', '.join(dict.fromkeys(s.arm for s in plan.specs))} x seeds "
                       f"{', '.join(map(str, plan.seeds))}; {plan.jobs} at a time")
    by_arm: dict = {}
    for spec, cfg in cfgs:
        by_arm.setdefault(spec.arm, cfg)  # the seeds of an arm share shapes and batch mapping
    by_memory: dict[tuple, list[str]] = {}
    for arm, cfg in by_arm.items():
        flat = cfg.flat()
        # the replay settings change the memory only through TRL's micro-batches (fresh + replay rows)
        key = tuple(flat.get(k) for k in MEMORY_KEYS if cfg.backend == "trl" or not k.startswith("replay."))
        by_memory.setdefault(key, []).append(arm)
    for arms in by_memory.values():
        check_memory(by_arm[arms[0]], host, gpu_memory, report, f" [{', '.join(arms)}]")
    for arm, cfg in by_arm.items():
        check_replay(cfg, report, f" [{arm}]")
        check_launch_rules(cfg, report, f" [{arm}]")
    for spec, cfg in cfgs:
        if not _check_continuation(spec, cfg, plan.specs, report):
            check_run_dir(cfg, report, f" [{spec.arm} seed {spec.seed}]")
    _check_seeds(cfgs, report)
    dirs = [spec.run_dir for spec, _ in cfgs]
    if len(set(dirs)) != len(dirs):
        report.refuse("--out", "two runs share a run directory, so the second would resume the first",
                      "report this: each (arm, seed, config) has its own directory")
    check_data(cfgs[0][1], report)
    if plan.bench is not None:
        _check_benchmarks(plan.bench, gpu, report)
    return report


def _check_continuation(spec, cfg, specs, report: Report) -> bool:
    """Whether the run will continue a shorter finished run instead of starting at step 0 (compare's own rule,
    `experiments.continuation`): a finished run of its lineage on disk, or a shorter one in this plan that it waits
    for. Says which; False for a run that starts or resumes in its own directory."""
    from ..experiments import continuation

    if spec.run_dir.exists():
        return False
    tag = f"[{spec.arm} seed {spec.seed}] {spec.run_dir}"
    every = cfg.eval_every
    shorter = [o for o in specs if o.lineage == spec.lineage and o.seed == spec.seed and o.steps < spec.steps
               and not (every and o.steps % every)]  # find_source's rule: a source ends on a scheduled evaluation
    source = continuation.find_source(spec.run_dir, spec.seed, spec.lineage, spec.steps, cfg.eval_every)
    if shorter:
        o = max(shorter, key=lambda o: o.steps)
        report.add("checkpoints", f"{tag}: waits for this plan's {o.arm} seed {o.seed} ({o.steps} steps) and "
                                  f"continues it to {spec.steps} steps (when it ends on a checkpoint)")
    elif source is not None:
        report.add("checkpoints", f"{tag}: continues {source} (a finished run of {RunDir(source).history().done} "
                                  f"steps with this config) to {spec.steps} steps")
    return bool(shorter) or source is not None


def _check_seeds(cfgs, report: Report) -> None:
    """Seeds per arm: each of an arm's runs must differ in every seeded key, or the 'seeds' repeat one run."""
    by_arm: dict[str, list] = {}
    for spec, cfg in cfgs:
        by_arm.setdefault(spec.arm, []).append(cfg)
    for arm, runs in by_arm.items():
        flat = [c.flat() for c in runs]
        report.add("seeds", f"{arm}: " + ", ".join(f"seed {f['seed']}" for f in flat))
        for key in SEEDED:
            values = [f.get(key) for f in flat]
            if len(set(values)) != len(values):
                report.refuse(f"{key} [{arm}]", f"{len(values)} seeds of the arm share {key}={values}",
                              "--seeds / --first-seed (compare sets each run's seed)")


def _check_benchmarks(bench, gpu: bool, report: Report) -> None:
    from ..app.data import default_data_dir

    data_dir = Path(bench.data_dir) if bench.data_dir else default_data_dir()
    report.add("benchmarks", f"{', '.join(bench.benchmarks)}: n={bench.n}, {bench.max_new_tokens} new tokens, "
                             f"--eval-backend {bench.backend}")
    if bench.backend == "vllm" and not gpu:
        report.refuse("--eval-backend", "vllm evaluates on a GPU, and these runs train on the CPU",
                      "--eval-backend transformers")
    if data_dir is None:
        report.refuse("--data-dir", "no benchmark directory: --data-dir is not given and $GRPO_REPLAY_DATA is unset",
                      "build the data (docs/paper_table.md) and set GRPO_REPLAY_DATA or --data-dir")
        return
    from ..app.data import resolve_benchmark
    from ..errors import UsageError

    for name in bench.benchmarks:
        try:
            report.add("benchmarks", f"{name}: {resolve_benchmark(name, data_dir)} (there)")
        except UsageError as e:
            report.refuse(f"--benchmarks {name}", str(e), "build the data (docs/paper_table.md) or point --data-dir "
                          "at it")
