"""The evaluation pipeline: load benchmarks, generate (with a resumable cache), grade, compute every metric.

:func:`run_evaluation` is the file-free core used by ``grpo-replay eval`` (and reusable by the experiment
runner): it takes any :class:`~grpo_replay.generation.Generator` and returns the results dictionary that
:mod:`grpo_replay.eval.benchmark_report` writes out.

Cache: ``<cache_dir>/<benchmark>-<fingerprint>.jsonl`` holds one line per generated problem (its id, prompt,
completions and token counts), appended batch by batch. The fingerprint covers the model (its path, and the
content of a single model file or the sizes and times of a directory's files), backend, the weights' dtype and
device, sampling parameters, prompt settings and batch size, so changing any of them starts a fresh file; an interrupted evaluation resumes with only the
missing problems. Each benchmark has its own label (`benchmark_labels`) and so its own cache file.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ..errors import UsageError

from ..app.data import Problem, load_problems, resolve_benchmark
from ..generation import Completion, Generator, SamplingParams
from .prompts import INSTRUCTION, build_prompt
from .grading import DEFAULT_TIMEOUT, grade_many
from .metrics import aes, evaluate_correctness, length_split, relative_change

MEAN_KEY = "mean"  # the row averaging the benchmarks


@dataclass
class EvalSettings:
    """Everything besides the model that determines an evaluation."""

    benchmarks: Sequence[str] = ("math500", "aime25", "aime26", "hmmt_feb25", "hmmt_feb26")
    ks: Sequence[int] = (1, 2, 4, 8, 16)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    data_dir: Optional[str] = None
    limit: Optional[int] = None
    instruction: str = INSTRUCTION
    use_chat_template: bool = True
    batch_size: int = 8
    grade_workers: Optional[int] = None
    grade_timeout: float = DEFAULT_TIMEOUT
    aes_weights: tuple[float, float, float] = (1.0, 3.0, 5.0)  # alpha, beta, gamma
    progress: bool = True

    def validate(self) -> None:
        if not self.benchmarks:
            raise UsageError("benchmarks: at least one benchmark is required")
        benchmark_labels(self.benchmarks)  # the same one twice is refused
        bad = [k for k in self.ks if k < 1 or k > self.sampling.n]
        if bad:
            raise UsageError(f"k values {bad} are invalid: each k must satisfy 1 <= k <= n={self.sampling.n}")
        twice = sorted({k for k in self.ks if list(self.ks).count(k) > 1})
        if twice:  # the table would hold one column for both, and the settings recorded list it twice
            raise UsageError(f"k values {twice} are given twice in {list(self.ks)}; give each k once")
        if self.batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"limit must be >= 1, got {self.limit}")
        if self.grade_workers is not None and self.grade_workers < 0:
            raise UsageError(f"grade_workers must be >= 0 (0 grades in this process; unset: by batch size), got {self.grade_workers}")
        if not (math.isfinite(self.grade_timeout) and self.grade_timeout > 0):
            raise UsageError(f"grade_timeout must be a finite number of seconds > 0, got {self.grade_timeout}")
        if len(self.aes_weights) != 3 or not all(math.isfinite(w) and w >= 0 for w in self.aes_weights):
            raise UsageError(f"aes_weights (alpha, beta, gamma) must be three finite numbers >= 0, got {tuple(self.aes_weights)}")


def load_benchmark(name: str, data_dir: Optional[str], limit: Optional[int]) -> list[Problem]:
    """A benchmark from the data directory, a JSONL path, or (else) a Hugging Face dataset name."""
    try:
        path = resolve_benchmark(name, data_dir)
    except (ValueError, FileNotFoundError):
        if not (os.path.exists(name) or "/" in name):  # neither a path nor a hub dataset like "HuggingFaceH4/MATH-500"
            raise
        path = name
    problems = list(load_problems(path, split="test", limit=limit))
    if not problems:  # a table of 0 problems would read as a result
        raise UsageError(f"benchmark {name!r} ({path}) has no problems")
    return problems


def benchmark_label(name: str) -> str:
    """Short label for a benchmark given as a name, path or dataset id."""
    return Path(name).stem if name.endswith(".jsonl") else name


def benchmark_labels(names: Sequence[str]) -> list[str]:
    """One distinct label per benchmark: its short label, or, where two would share one (a/test.jsonl and
    b/test.jsonl), as many trailing path parts as tell them apart (a/test, b/test). The label keys the results
    and names the cache file, so a shared one would drop a benchmark. The same benchmark given twice is refused."""
    seen: dict[str, str] = {}
    for name in names:
        key = os.path.abspath(name) if os.path.exists(name) else name
        if key in seen:
            raise UsageError(f"benchmarks: {name!r} is given twice ({seen[key]!r} and {name!r}); give it once")
        seen[key] = name
    short = [benchmark_label(n) for n in names]
    parts = [Path(os.path.abspath(n)).with_suffix("").parts if n.endswith(".jsonl") else (n,) for n in names]
    labels = list(short)
    for i, label in enumerate(short):
        clash = [j for j, other in enumerate(short) if other == label and j != i]
        if not clash:
            continue
        depth = 1
        while depth < len(parts[i]) and any(parts[j][-depth - 1:] == parts[i][-depth - 1:] for j in clash):
            depth += 1
        labels[i] = "/".join(parts[i][-depth - 1:])
    return labels


def _cache_name(label: str) -> str:
    return label.replace("/", "__")


# ----------------------------------------------------------------------------------------------------------
# Generation with cache


def engine_info(generator: Generator) -> dict[str, str]:
    """What besides the model and the settings changes a completion: the dtype and device of a generator's torch
    weights (bfloat16 and float32 sample different texts under one seed); {} for an engine without them (vLLM)."""
    try:
        p = next(generator.model.parameters())  # type: ignore[attr-defined]
    except (AttributeError, StopIteration, TypeError):
        return {}
    return {"dtype": str(p.dtype).removeprefix("torch."), "device": str(p.device)}


def fingerprint(model_id: str, backend: str, settings: EvalSettings, engine: Optional[Mapping[str, str]] = None) -> str:
    """12 hex digits identifying (model version, backend and its `engine_info`, sampling and prompt settings,
    batch size: a batch draws from one seed, so its size changes each problem's completions)."""
    stamp: Any = None
    if os.path.isfile(model_id):
        # One file (GGUF): its content, so a file replaced at the same path (mtime kept or not) is noticed.
        from ..app.models import sha256_file

        stamp = sha256_file(Path(model_id))
    elif os.path.isdir(model_id):  # retraining into the same directory must not reuse old generations
        root = Path(model_id)
        stamp = sorted((str(f.relative_to(root)), f.stat().st_size, f.stat().st_mtime_ns)
                       for f in root.rglob("*") if f.is_file())
    key = {
        "model": os.path.abspath(model_id) if os.path.exists(model_id) else model_id,
        "model_files": stamp,
        "backend": backend,
        "sampling": settings.sampling.to_dict(),
        "instruction": settings.instruction,
        "chat_template": settings.use_chat_template,
        "batch_size": settings.batch_size,
        "engine": dict(engine or {}),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _read_cache(path: Path, n: int) -> dict[str, dict]:
    records: dict[str, dict] = {}
    if not path.exists():
        return records
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by an interruption: regenerate that problem
            if len(rec.get("texts", [])) == n:
                records[rec["id"]] = rec
    return records


def _batch_seed(base: int, ids: Sequence[str]) -> int:
    # Stable across runs and processes (unlike hash()), and different for every batch.
    return (base * 1_000_003 + zlib.crc32("\x00".join(ids).encode())) % (2**31)


def generate_benchmark(
    generator: Generator,
    problems: Sequence[Problem],
    prompts: Sequence[str],
    settings: EvalSettings,
    cache_path: Optional[Path],
    desc: str = "generating",
) -> tuple[list[list[Completion]], dict]:
    """Completions for every problem, reusing the cache and appending new batches to it."""
    from tqdm.auto import tqdm

    n = settings.sampling.n
    cached = _read_cache(cache_path, n) if cache_path else {}
    out: dict[str, list[Completion]] = {}
    for p, prompt in zip(problems, prompts):
        rec = cached.get(p.id)
        if rec is not None and rec.get("prompt") == prompt:
            out[p.id] = [Completion(t, int(l)) for t, l in zip(rec["texts"], rec["num_tokens"])]
    todo = [(p, q) for p, q in zip(problems, prompts) if p.id not in out]
    stats = {"from_cache": len(out), "generated": len(todo)}
    if cache_path:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(problems), initial=len(out), desc=desc, disable=not settings.progress, unit="problem")
    try:
        for start in range(0, len(todo), settings.batch_size):
            batch = todo[start : start + settings.batch_size]
            ids = [p.id for p, _ in batch]
            groups = generator.generate([q for _, q in batch], settings.sampling, _batch_seed(settings.sampling.seed, ids))
            lines = []
            for (p, q), group in zip(batch, groups):
                out[p.id] = group
                rec = {"id": p.id, "prompt": q, "texts": [c.text for c in group], "num_tokens": [c.num_tokens for c in group]}
                lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
            if cache_path:
                with open(cache_path, "a", encoding="utf-8") as fh:  # whole lines per batch: resumable
                    fh.writelines(lines)
                    fh.flush()
            bar.update(len(batch))
    finally:
        bar.close()
    return [out[p.id] for p in problems], stats


# ----------------------------------------------------------------------------------------------------------
# Scoring


def score_benchmark(
    problems: Sequence[Problem], completions: Sequence[Sequence[Completion]], settings: EvalSettings, desc: str = "grading"
) -> dict:
    """Grade every completion and compute mean@n, pass@k and the length split for one benchmark."""
    texts = [c.text for group in completions for c in group]
    golds = [p.answer for p, group in zip(problems, completions) for _ in group]
    verdicts = grade_many(
        texts, golds, workers=settings.grade_workers, timeout=settings.grade_timeout, progress=settings.progress, desc=desc
    )
    per_problem, counts, lengths, correct = [], [], [], []
    i = 0
    for p, group in zip(problems, completions):
        ok = verdicts[i : i + len(group)]
        i += len(group)
        lens = [c.num_tokens for c in group]
        counts.append((len(group), sum(ok)))
        lengths += lens
        correct += ok
        per_problem.append(
            {"id": p.id, "n": len(group), "c": int(sum(ok)), "mean_length": sum(lens) / len(lens) if lens else None}
        )
    res = evaluate_correctness(counts, settings.ks)
    return {
        "num_problems": res["num_problems"],
        "n": settings.sampling.n,
        "mean@n": res["mean@n"],
        "pass@k": {str(k): v for k, v in res["pass@k"].items()},
        "num_samples": res["num_samples"],
        "num_correct": res["num_correct"],
        "length": length_split(lengths, correct),
        "problems": per_problem,
    }


def summarize(per_benchmark: Mapping[str, dict]) -> dict:
    """The benchmark-average row: unweighted mean of each benchmark's numbers (the paper's "average")."""

    def avg(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    rows = list(per_benchmark.values())
    ks = sorted({k for r in rows for k in r["pass@k"]}, key=int)
    return {
        "num_benchmarks": len(rows),
        "mean@n": avg([r["mean@n"] for r in rows]),
        "pass@k": {k: avg([r["pass@k"].get(k) for r in rows]) for k in ks},
        "length": {part: avg([r["length"][part] for r in rows]) for part in ("all", "correct", "incorrect")},
    }


def compare_to_baseline(row: dict, base: dict, weights: tuple[float, float, float]) -> dict:
    """AES (accuracy = mean@n, length = mean tokens of all completions) and relative length changes."""
    alpha, beta, gamma = weights
    out: dict[str, Any] = {
        "base_mean@n": base.get("mean@n"),
        "length_change": {
            part: relative_change(row["length"].get(part), base.get("length", {}).get(part))
            for part in ("all", "correct", "incorrect")
        },
    }
    try:
        out["aes"] = aes(row["mean@n"], row["length"]["all"], base["mean@n"], base["length"]["all"], alpha, beta, gamma)
    except (ValueError, TypeError, KeyError) as exc:  # zero/missing baseline numbers: undefined, say why
        out["aes"], out["aes_note"] = None, str(exc)
    return out


def run_evaluation(
    generator: Generator,
    settings: EvalSettings,
    *,
    tokenizer=None,
    model_id: str = "model",
    backend: str = "transformers",
    cache_dir: Optional[Path] = None,
    baseline: Optional[dict] = None,
) -> dict:
    """Evaluate on every benchmark; returns the full results dictionary (JSON-serialisable)."""
    settings.validate()
    engine = engine_info(generator)
    fp = fingerprint(model_id, backend, settings, engine)
    results: dict[str, Any] = {
        "model": model_id,
        "backend": backend,
        "engine": engine,
        "fingerprint": fp,
        "settings": {
            "benchmarks": list(settings.benchmarks),
            "ks": list(settings.ks),
            "sampling": settings.sampling.to_dict(),
            "limit": settings.limit,
            "instruction": settings.instruction,
            "chat_template": settings.use_chat_template,
            "batch_size": settings.batch_size,
            "aes_weights": dict(zip(("alpha", "beta", "gamma"), settings.aes_weights)),
        },
        "benchmarks": {},
    }
    for name, label in zip(settings.benchmarks, benchmark_labels(settings.benchmarks)):
        problems = load_benchmark(name, settings.data_dir, settings.limit)
        prompts = [build_prompt(p.problem, tokenizer, settings.instruction, settings.use_chat_template) for p in problems]
        cache_path = Path(cache_dir) / f"{_cache_name(label)}-{fp}.jsonl" if cache_dir else None
        completions, stats = generate_benchmark(generator, problems, prompts, settings, cache_path, desc=label)
        row = score_benchmark(problems, completions, settings, desc=f"grading {label}")
        row["cache"] = stats
        results["benchmarks"][label] = row
    results[MEAN_KEY] = summarize(results["benchmarks"])
    if baseline is not None:
        results["baseline"] = {"model": baseline.get("model"), "fingerprint": baseline.get("fingerprint")}
        for label, row in results["benchmarks"].items():
            if label in baseline.get("benchmarks", {}):
                row["vs_baseline"] = compare_to_baseline(row, baseline["benchmarks"][label], settings.aes_weights)
        if MEAN_KEY in baseline:
            results[MEAN_KEY]["vs_baseline"] = compare_to_baseline(results[MEAN_KEY], baseline[MEAN_KEY], settings.aes_weights)
    return results
