"""The benchmark stage of `grpo-replay compare --model ...`: each finished run's final checkpoint through the
evaluation harness (`grpo_replay.eval`), one result file per (run, benchmark), checkpoints deleted afterwards.

Resumable at three levels: a run with `summary.json` is not retrained (jobs.py); a benchmark whose result file
`<run dir>/bench/<benchmark>-<settings key>.json` exists is not re-evaluated; an interrupted benchmark resumes
from the harness's own generation cache (`<run dir>/bench/cache/`). The settings key hashes every evaluation
setting that changes the numbers, so changing one re-evaluates instead of reusing stale results. Once every
requested benchmark of a run has its result, the run's checkpoints (`ckpt-*/`, TRL's `final/`) are deleted unless
`keep_checkpoints` (disk is finite); a later request for a new benchmark or setting then fails clearly for that run.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import traceback
from concurrent.futures import as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from ..app import configio
from ..app.data import BENCHMARKS
from ..app.run_files import BENCH, CHECKPOINT_PREFIX, FINAL
from ..errors import UsageError
from .jobs import RunSpec, gpu_device, worker_pool

PRUNED = "checkpoints_deleted.json"  # marker in <run dir>/bench/: the final checkpoint was deleted after evaluation
EVAL_BACKENDS = ("transformers", "vllm")
_UNKEYED = ("batch_size", "device", "dtype", "keep_checkpoints")  # where and how fast, not what is computed


@dataclass(frozen=True)
class BenchSettings:
    """How every final checkpoint is evaluated (the paper's protocol by default: n = 16 samples at 0.6 / 0.95)."""

    benchmarks: tuple[str, ...] = BENCHMARKS
    n: int = 16
    ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 4096
    limit: Optional[int] = None
    data_dir: Optional[str] = None
    backend: str = "transformers"
    # Not part of the key (_UNKEYED):
    batch_size: int = 8
    device: str = "auto"
    dtype: str = "auto"
    keep_checkpoints: bool = False

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> None:  # named by its command-line flag
            configio.bad(self, name, allowed, label=f"--eval-{name.replace('_', '-')}")

        if not self.benchmarks:
            raise UsageError("--benchmarks: at least one benchmark is required")
        if self.n < 1:
            bad("n", "an integer >= 1 (samples per problem)")
        if not self.ks or any(k < 1 or k > self.n for k in self.ks):
            raise UsageError(f"--eval-k={list(self.ks)} is invalid; allowed: integers 1 <= k <= --eval-n={self.n}")
        if len(set(self.ks)) != len(self.ks):
            raise UsageError(f"--eval-k={list(self.ks)} is invalid; allowed: each k once")
        if self.backend not in EVAL_BACKENDS:
            bad("backend", ", ".join(EVAL_BACKENDS))
        if self.limit is not None and self.limit < 1:
            bad("limit", "an integer >= 1")
        if self.batch_size < 1:
            bad("batch_size", "an integer >= 1")
        # Checked here, not only where the evaluation builds its SamplingParams: that is after every run has trained.
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            bad("temperature", "a finite number >= 0 (0 = greedy)")
        if self.temperature == 0 and self.n > 1:
            bad("n", "1 with --eval-temperature 0 (greedy decoding: one completion per problem), or a temperature > 0")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            bad("top_p", "a number in (0, 1]")
        if self.max_new_tokens < 1:
            bad("max_new_tokens", "an integer >= 1")

    def key(self) -> str:
        d = {k: v for k, v in asdict(self).items() if k not in _UNKEYED}
        d["data_dir"] = os.path.abspath(self.data_dir) if self.data_dir else None
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=list).encode()).hexdigest()[:8]

    def labels(self) -> list[str]:
        from ..eval.harness import benchmark_label

        return [benchmark_label(b) for b in self.benchmarks]

    def to_dict(self) -> dict:
        return asdict(self)


def result_path(run_dir: Path, label: str, bs: BenchSettings) -> Path:
    return Path(run_dir) / BENCH / f"{label}-{bs.key()}.json"


def missing_benchmarks(run_dir: Path, bs: BenchSettings) -> list[str]:
    return [b for b, label in zip(bs.benchmarks, bs.labels()) if not result_path(run_dir, label, bs).exists()]


def load_results(run_dir: Path, bs: BenchSettings) -> Optional[dict[str, dict]]:
    """{benchmark label: the harness's row} when every benchmark is evaluated, else None."""
    out = {}
    for label in bs.labels():
        p = result_path(run_dir, label, bs)
        if not p.exists():
            return None
        out[label] = json.loads(p.read_text())["row"]
    return out


def final_model_dir(run_dir: Path) -> Optional[Path]:
    """The trained model of a finished run: TRL's `final/`, else the built-in trainer's last checkpoint's `model/`."""
    from ..trainer.checkpoint import MODEL
    from ..trainer.rundir import RunDir

    run_dir = Path(run_dir)
    if (run_dir / FINAL / "config.json").exists():
        return run_dir / FINAL
    ckpt = RunDir(run_dir).latest_checkpoint()
    return ckpt / MODEL if ckpt is not None and (ckpt / MODEL / "config.json").exists() else None


def delete_checkpoints(run_dir: Path) -> list[str]:
    """Remove the run's model copies (training is finished: summary.json exists); returns what was removed."""
    run_dir = Path(run_dir)
    gone = [p for p in sorted(run_dir.glob(CHECKPOINT_PREFIX + "*")) + [run_dir / FINAL] if p.is_dir()]
    for p in gone:
        shutil.rmtree(p)
    (run_dir / BENCH).mkdir(parents=True, exist_ok=True)
    (run_dir / BENCH / PRUNED).write_text(json.dumps({"deleted": [p.name for p in gone], "time": time.time()}))
    return [p.name for p in gone]


# ----------------------------------------------------------------------------------------- worker side
def _ensure_tokenizer(model_dir: Path, overrides: dict) -> None:
    """A TRL `final/` may hold weights only; the eval harness loads the tokenizer from the same directory."""
    if (model_dir / "tokenizer_config.json").exists():
        return
    from transformers import AutoTokenizer

    from ..app.models import dense_source, resolve_model

    src = dense_source(resolve_model(str(overrides["model"]), overrides.get("model_file")))
    AutoTokenizer.from_pretrained(src.path, **src.kwargs()).save_pretrained(model_dir)


def evaluate_run(run_dir: str, seed: int, overrides: dict, bs: BenchSettings) -> dict:
    """Evaluate one finished run on its missing benchmarks (worker process); prune checkpoints when complete."""
    from ..generation import SamplingParams
    from ..generation.transformers import TransformersGenerator, load_model
    from ..generation.vllm import VLLMGenerator
    from ..eval.harness import EvalSettings, benchmark_label, run_evaluation

    t0 = time.time()
    rd = Path(run_dir)
    todo = missing_benchmarks(rd, bs)
    if todo:
        model_dir = final_model_dir(rd)
        if model_dir is None:
            why = "its checkpoints were deleted after an earlier evaluation" if (rd / BENCH / PRUNED).exists() else "it has no final checkpoint"
            raise RuntimeError(
                f"cannot evaluate {rd} on {', '.join(todo)}: {why}. Use a new --out (or delete this run directory) "
                "to retrain, and --keep-checkpoints to keep them for later evaluations."
            )
        _ensure_tokenizer(model_dir, overrides)
        sampling = SamplingParams(n=bs.n, temperature=bs.temperature, top_p=bs.top_p, max_new_tokens=bs.max_new_tokens, seed=seed)
        if bs.backend == "vllm":
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(model_dir)
            gen = VLLMGenerator(str(model_dir), tok, add_special_tokens=not getattr(tok, "chat_template", None), seed=seed)
        else:
            model, tok = load_model(str(model_dir), device=bs.device, dtype=bs.dtype)
            # A chat template already writes BOS; adding special tokens again would double it.
            gen = TransformersGenerator(model, tok, add_special_tokens=not getattr(tok, "chat_template", None))
        (rd / BENCH).mkdir(parents=True, exist_ok=True)
        log = open(rd / BENCH / "eval.log", "a")
        try:
            for name in todo:
                settings = EvalSettings(
                    benchmarks=[name], ks=list(bs.ks), sampling=sampling, data_dir=bs.data_dir, limit=bs.limit,
                    batch_size=bs.batch_size, progress=False,
                )
                t1 = time.time()
                res = run_evaluation(gen, settings, tokenizer=tok, model_id=str(model_dir), backend=bs.backend, cache_dir=rd / BENCH / "cache")
                label = benchmark_label(name)
                row = res["benchmarks"][label]
                out = {"row": row, "model": str(model_dir), "fingerprint": res["fingerprint"], "settings": res["settings"], "seconds": time.time() - t1}
                tmp = result_path(rd, label, bs).with_suffix(".tmp")
                tmp.write_text(json.dumps(out))
                os.replace(tmp, result_path(rd, label, bs))  # whole file or nothing: a result file is always complete
                log.write(f"{label}: mean@{bs.n} {row['mean@n']:.4f} over {row['num_problems']} problems in {time.time() - t1:.0f}s\n")
                log.flush()
        except Exception as e:
            traceback.print_exc(file=log)
            raise RuntimeError(f"{type(e).__name__}: {e} (traceback in {rd / BENCH / 'eval.log'})") from None
        finally:
            log.close()
            close = getattr(gen, "close", None)  # a vLLM engine: its GPU memory and process groups
            if callable(close):
                close()
    pruned = [] if bs.keep_checkpoints or (rd / BENCH / PRUNED).exists() else delete_checkpoints(rd)
    return {"wall_s": time.time() - t0, "evaluated": todo, "pruned": pruned}


# ----------------------------------------------------------------------------------------- driver side
def evaluate_all(specs: list[RunSpec], bs: BenchSettings, jobs: int, log=print) -> dict[str, Any]:
    """Evaluate every finished run that lacks a benchmark result, over `jobs` spawned workers.

    Returns {"evaluated", "skipped", "failed": [...], "wall_s"}; failures do not stop the other runs."""
    t0 = time.time()
    done = [s for s in specs if s.done]
    todo = [s for s in done if missing_benchmarks(s.run_dir, bs) or not (bs.keep_checkpoints or (s.run_dir / BENCH / PRUNED).exists())]
    res: dict[str, Any] = {"evaluated": 0, "skipped": len(done) - len(todo), "failed": [], "wall_s": 0.0}
    if not todo:
        return res
    log(f"compare: evaluating {len(todo)} run(s) on {', '.join(bs.labels())} (n={bs.n}, {bs.backend})")
    old_omp = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        fresh = bs.backend == "vllm" or gpu_device(bs.device)
        with worker_pool(max(1, min(jobs, len(todo))), fresh) as pool:
            futs = {pool.submit(evaluate_run, str(s.run_dir), s.seed, s.overrides, bs): s for s in todo}
            for f in as_completed(futs):
                s = futs[f]
                err = f.exception()
                if err is None:
                    r = f.result()
                    res["evaluated"] += 1
                    pruned = f", deleted {', '.join(r['pruned'])}" if r["pruned"] else ""
                    log(f"  evaluated {s.arm} seed {s.seed} in {r['wall_s']:.0f}s{pruned}")
                else:
                    res["failed"].append({"arm": s.arm, "seed": s.seed, "run_dir": str(s.run_dir), "error": str(err)})
                    log(f"  EVAL FAILED {s.arm} seed {s.seed}: {str(err).splitlines()[0]}")
    finally:
        if old_omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old_omp
    res["wall_s"] = time.time() - t0
    return res
