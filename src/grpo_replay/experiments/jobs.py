"""Planning and running the training runs of a comparison: one process per run, resumable, with progress.

Each run is one `grpo_replay.trainer.loop.train` call in a worker process (spawned, one torch thread each).
Warm starts are computed first, one per distinct testbed config, so no two workers ever train the same warm start.
A run whose directory holds `summary.json` is finished and skipped; an unfinished one is resumed by the trainer
from its last checkpoint. The run directory name carries a hash of the resolved config, so changing any setting
(or a testbed default) starts fresh runs instead of silently reusing stale ones. A new run that only runs longer
than a finished one (same config but `steps`) continues it (`continuation.py`); it waits while that shorter run is
still to do in the same invocation.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..app import configio
from ..app.run_files import CONFIG, METRICS, SUMMARY, TRAIN_LOG
from ..errors import ConfigError
from . import continuation
from .arms import Arm, seed_overrides

# Keys that change nothing a run computes or writes into its results, only where its files go, where the warm start
# is cached, what is printed while it runs and which trackers get a copy of its rows: excluded from the run-directory
# hash, and from the settings a report says its runs share (a reused run may have had other values). A tracker
# asked for that a started run lacks is refused (`_refuse_missing_trackers`): its logs cannot be added afterwards.
UNHASHED = ("out_dir", "progress", "testbed.cache_dir", "testbed.progress_every", "report_to")
# Keys hashed only away from their default: a run that leaves them alone computes what a run made before they existed
# did (the update and the generation are the same code path), so it keeps that run's hash and directory.
# drift_probe adds the drift/* columns: a run without them lacks what was asked.
_HASHED_WHEN_SET = {"update_epochs": 1, "dynamic_sampling": False, "max_generation_rounds": 10, "drift_probe": 0,
                    "advantage_estimator": "grpo", "reward_funcs": (), "reward_weights": ()}
# Hashed only since then: a finished run under the hash without them is reused when its config holds the values asked.
_HASHED_LATER = ("drift_probe",)


@dataclass
class RunSpec:
    arm: str
    seed: int
    overrides: dict
    run_dir: Path
    steps: int
    lineage: str = ""
    """`continuation.lineage` of the config: specs with equal lineage differ only in their steps."""

    @property
    def done(self) -> bool:
        return (self.run_dir / SUMMARY).exists()

    def steps_done(self) -> int:
        p = self.run_dir / METRICS
        if self.done:
            return self.steps
        try:
            with open(p, "rb") as f:
                return min(self.steps, sum(1 for _ in f))
        except OSError:
            return 0


def config_hash(overrides: dict, unhashed: tuple[str, ...] = UNHASHED) -> str:
    """Short hash of the fully resolved TrainConfig (defaults included), minus keys that do not change results."""
    from ..trainer.train_config import resolve

    flat = configio.flatten(resolve(overrides).to_dict())
    for k in unhashed:
        flat.pop(k, None)
    for k, default in _HASHED_WHEN_SET.items():
        if flat.get(k) == default:
            flat.pop(k)
    blob = json.dumps(flat, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def plan(
    arms: list[Arm], seeds: list[int], base_overrides: dict, out: Path, cache_dir: Optional[str] = None
) -> list[RunSpec]:
    """One RunSpec per (arm, seed): setting overrides < arm overrides < seed overrides."""
    specs = []
    for arm in arms:
        for seed in seeds:
            ov = {**base_overrides, **arm.overrides, **seed_overrides(seed), "progress": False}
            if cache_dir:
                ov["testbed.cache_dir"] = str(cache_dir)
            run_dir = _run_dir(out / "runs" / arm.name, seed, ov)
            ov["out_dir"] = str(run_dir)
            _check_backend(ov)
            specs.append(RunSpec(arm.name, seed, ov, run_dir, int(ov["steps"]), continuation.lineage(ov)))
    _refuse_missing_trackers(specs)
    return specs


def _refuse_missing_trackers(specs: list[RunSpec]) -> None:
    """ConfigError when a planned run already started (its config.yaml is there) without a tracker now asked for:
    the run would be reused or resumed, and the tracker would miss its earlier rows."""
    from ..trainer.train_config import resolve

    lacking = []
    for s in specs:
        asked = set(resolve(s.overrides).report_to.split(",")) - {"none"}
        if not asked or not (s.run_dir / CONFIG).is_file():
            continue
        try:
            made = set(resolve(yaml_path=str(s.run_dir / CONFIG)).report_to.split(","))
        except (ValueError, TypeError, RecursionError):
            continue  # not readable as a config: the run's own start refuses the directory
        if asked - made:
            lacking.append((s.run_dir, sorted(asked - made)))
    if lacking:
        run_dir, missing = lacking[0]
        raise ConfigError(
            f"report_to={','.join(sorted(asked))}: {len(lacking)} of the planned runs were started without "
            f"{','.join(missing)} (e.g. {run_dir}), and a tracker cannot get a run's earlier rows afterwards; allowed: "
            "the trackers those runs were made with, or a new --out for runs made with them")


def _run_dir(arm_dir: Path, seed: int, overrides: dict) -> Path:
    """seed{seed}-{hash}; a run made before `_HASHED_LATER` were hashed is found under the older hash and reused
    when its config.yaml holds the values asked for."""
    from ..trainer.train_config import resolve

    new = arm_dir / f"seed{seed}-{config_hash(overrides)}"
    old = arm_dir / f"seed{seed}-{config_hash(overrides, UNHASHED + _HASHED_LATER)}"
    if old == new or new.exists() or not (old / CONFIG).is_file():
        return new
    try:
        made = resolve(yaml_path=str(old / CONFIG)).flat()
    except (ValueError, TypeError, RecursionError):  # unreadable: the run is not reused
        return new
    asked = resolve(overrides).flat()
    return old if all(made[k] == asked[k] for k in _HASHED_LATER) else new


def _check_backend(overrides: dict) -> None:
    """A setting the run's backend refuses is a ConfigError here, before any run or warm start (in a worker it
    would only fail that run, after the warm starts)."""
    from ..trainer.train_config import resolve

    cfg = resolve(overrides)
    if cfg.backend == "trl":
        from ..trainer.trl import settings as trl_settings

        trl_settings.check(cfg)


def uses_gpu(overrides: dict) -> bool:
    """Whether the run trains on a GPU or generates with vLLM: then it gets a worker process of its own."""
    from ..trainer.train_config import resolve

    cfg = resolve(overrides)
    return cfg.generator == "vllm" or gpu_device(cfg.device)


def gpu_device(device: str) -> bool:
    if device == "cpu":
        return False
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return True


def worker_pool(jobs: int, fresh: bool) -> ProcessPoolExecutor:
    """`jobs` spawned workers; with `fresh`, each task in a new process. A vLLM engine does not give back its GPU
    memory, process groups and port when the object goes (`VLLMGenerator.close` tears down what it can), and CUDA
    caches outlive a run, so GPU runs never share a process."""
    extra = {"max_tasks_per_child": 1} if fresh and sys.version_info >= (3, 11) else {}
    return ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_init_worker, **extra)


# ----------------------------------------------------------------------------------------- worker side
def _init_worker() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(1)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass


def _warm_one(overrides: dict) -> str:
    from ..tasks.testbed import warm_start
    from ..trainer.train_config import resolve

    tb = resolve(overrides).testbed
    _, _, info = warm_start(tb, progress=False)
    return str(info.get("cache_path", ""))


def _train_one(overrides: dict) -> dict:
    from ..trainer import rundir
    from ..trainer.train_config import resolve
    from ..trainer.loop import train
    from ..trainer.trl.backend import train_with_trl

    t0 = time.time()
    cfg = resolve(overrides)
    run = train_with_trl if cfg.backend == "trl" else train  # the same dispatch as `grpo-replay train`
    rundir.mark(cfg.run_dir)  # train.log is written before train() claims the directory
    # The run's own prints and warnings go to <run dir>/train.log, not over the progress display.
    with open(cfg.run_dir / TRAIN_LOG, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            summary = run(cfg)
        except Exception as e:  # re-raised as a plain error so any exception type crosses the process boundary
            traceback.print_exc()
            raise RuntimeError(f"{type(e).__name__}: {e} (traceback in {cfg.run_dir / TRAIN_LOG})") from None
    return {"wall_s": time.time() - t0, "generated": summary.get("generated_rollouts")}


# ----------------------------------------------------------------------------------------- driver side
class _Progress:
    """One bar over all training steps of all runs to do (polled from each run's metrics.jsonl)."""

    def __init__(self, specs: list[RunSpec], enabled: bool):
        self.specs, self.enabled = specs, enabled
        self.total = sum(s.steps for s in specs)
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc="compare", unit="step", dynamic_ncols=True, file=sys.stderr)

    def update(self, done: int, running: list[RunSpec], failed: int) -> None:
        if self.bar is None:
            return
        n = sum(s.steps_done() for s in self.specs)
        self.bar.n = n
        post = f"runs {done}/{len(self.specs)}"
        if failed:
            post += f", {failed} failed"
        if running:
            post += " | " + ", ".join(f"{s.arm}/s{s.seed}" for s in running[:4])
        self.bar.set_postfix_str(post, refresh=False)
        self.bar.refresh()

    def log(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def execute(specs: list[RunSpec], jobs: int, progress: bool = True, poll_s: float = 2.0) -> dict[str, Any]:
    """Run every unfinished spec over `jobs` worker processes. Returns {"ran", "skipped", "failed": [...], "wall_s"}.

    Failures do not stop the other runs; they are returned (and the caller reports them)."""
    t0 = time.time()
    todo = [s for s in specs if not s.done]
    skipped = len(specs) - len(todo)
    result: dict[str, Any] = {"ran": 0, "skipped": skipped, "failed": [], "wall_s": 0.0}
    if not todo:
        return result
    jobs = max(1, min(jobs, len(todo)))
    prog = _Progress(todo, progress)
    prog.log(f"compare: {len(todo)} runs to do ({skipped} finished runs skipped), {jobs} parallel jobs")
    old_omp = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned workers before torch is imported
    try:
        with worker_pool(jobs, fresh=any(uses_gpu(s.overrides) for s in todo)) as pool:
            try:
                _warm_starts(pool, todo, prog)
                _train_all(pool, todo, prog, result, poll_s)
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    finally:
        if old_omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old_omp
        prog.close()
    result["wall_s"] = time.time() - t0
    return result


def _warm_starts(pool: ProcessPoolExecutor, todo: list[RunSpec], prog: _Progress) -> None:
    """Compute (or load) each distinct warm start once, in parallel, before any run needs it."""
    from ..tasks.testbed.warmstart import is_complete
    from ..trainer.train_config import resolve

    distinct: dict[str, dict] = {}
    for s in todo:
        cfg = resolve(s.overrides)
        if cfg.reward == "testbed":
            distinct.setdefault(str(cfg.testbed.cache_path()), s.overrides)
    missing = {k: ov for k, ov in distinct.items() if not is_complete(Path(k))}
    if not missing:
        return
    prog.log(f"compare: computing {len(missing)} warm start(s) first")
    futs = [pool.submit(_warm_one, ov) for ov in missing.values()]
    for f in futs:
        f.result()


def _train_all(pool: ProcessPoolExecutor, todo: list[RunSpec], prog: _Progress, result: dict, poll_s: float) -> None:
    running: dict[Future, RunSpec] = {}
    queue = list(todo)
    jobs = pool._max_workers  # noqa: SLF001  (keep only `jobs` runs in flight, so the bar shows what runs)
    done = 0
    while queue or running:
        while len(running) < jobs and (s := _next_ready(queue, list(running.values()))) is not None:
            queue.remove(s)
            _continue_shorter(s, prog)
            running[pool.submit(_train_one, s.overrides)] = s
        finished, _ = wait(list(running), timeout=poll_s, return_when=FIRST_COMPLETED)
        for f in finished:
            s = running.pop(f)
            done += 1
            err = f.exception()
            if err is None:
                r = f.result()
                result["ran"] += 1
                prog.log(f"  done {s.arm} seed {s.seed} in {r['wall_s']:.0f}s -> {s.run_dir}")
            else:
                result["failed"].append({"arm": s.arm, "seed": s.seed, "run_dir": str(s.run_dir), "error": str(err)})
                prog.log(f"  FAILED {s.arm} seed {s.seed}: {str(err).splitlines()[0]}")
        prog.update(done, list(running.values()), len(result["failed"]))


def _next_ready(queue: list[RunSpec], running: list[RunSpec]) -> Optional[RunSpec]:
    """The first queued spec no shorter run of its lineage is still to do before (queued or running): a longer run
    waits for the run it can continue."""
    pending = queue + running
    for s in queue:
        if not any(o.lineage == s.lineage and o.seed == s.seed and o.steps < s.steps for o in pending):
            return s
    return None


def _continue_shorter(s: RunSpec, prog: "_Progress") -> None:
    """Seed a new run's directory from the finished shorter run it continues, if there is one."""
    if s.run_dir.exists():
        return  # begun already: the trainer resumes its own checkpoint
    from ..trainer.train_config import resolve

    source = continuation.find_source(s.run_dir, s.seed, s.lineage, s.steps, resolve(s.overrides).eval_every)
    if source is not None:
        continuation.continue_from(source, s.run_dir)
        prog.log(f"  {s.arm} seed {s.seed}: continues {source} ({s.steps} steps)")
