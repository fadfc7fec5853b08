"""The paper recipe's data directory, built from public Hugging Face datasets:

    python -m grpo_replay.app.paper_data --out "$GRPO_REPLAY_DATA"

writes `train/math_train.jsonl` and `benchmarks/{math500,aime25,aime26,hmmt_feb25,hmmt_feb26}.jsonl`, one JSON
object a line with exactly the string keys id, problem, answer, source (what `app.data.load_problems` and the
evaluation harness read). Each file is checked before it is written (row count, keys, no empty field, unique ids
and problems, AIME answers in 0..999, no `\\boxed` left in an answer, no training problem that is a MATH-500
problem) and replaced atomically; a file whose check fails is not written and the command exits 2 naming it.

MATH's training split has no answer field: the answer is the solution's `\\boxed{}`. A solution with an empty box or
with several boxes of different content (multi-part or alternative answers) is dropped, as an ambiguous gold
answer: 27 of MATH's 7,500, leaving 7,473.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..errors import InputNotFound, MissingDependency, UsageError
from .answers import all_boxed
from .configio import path_arg


@dataclass(frozen=True)
class Source:
    """One output file: the hub dataset it is built from and the rows it must end with."""

    file: str
    """Path under the output directory."""
    dataset: str
    """Hugging Face dataset name, as `datasets.load_dataset` takes it."""
    split: str
    """The dataset's split."""
    rows: int
    """Rows the written file must have (after the drops of MATH's training split)."""
    convert: Callable[[list[dict[str, Any]], str], list[dict[str, str]]]
    """Hub rows and the source label -> our rows."""


class BadRow(ValueError):
    """A dataset row a converter cannot read: its 1-based number and the field, as the dataset spells it."""

    def __init__(self, row: int, field: str, why: str):
        super().__init__(f"row {row}: field {field!r} {why}")


def _get(r: Any, i: int, field: str) -> Any:
    if not isinstance(r, dict) or field not in r:
        raise BadRow(i, field, "is missing")
    return r[field]


def _text(r: Any, i: int, field: str, strip: bool = False) -> Optional[str]:
    """The field as a string, None when it is null (`check_rows` refuses it by name: never the text "None")."""
    v = _get(r, i, field)
    return None if v is None else (str(v).strip() if strip else str(v))


def _index(r: Any, i: int, field: str = "problem_idx") -> int:
    v = _get(r, i, field)
    if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str) and v.strip().isdigit())):
        raise BadRow(i, field, f"is {v!r}; allowed: a whole number")
    return int(v)


def _math500(rows, label):
    out = []
    for i, r in enumerate(rows, start=1):
        ident = _text(r, i, "unique_id")
        out.append({"id": ident, "problem": _get(r, i, "problem"), "answer": _text(r, i, "answer"),
                    "source": f"{label}#{ident}"})
    return out


def _aime(prefix: str):
    """MathArena's AIME sets number the two papers' 15 problems 1-30: I-1..15, then II-1..15."""
    def convert(rows, label):
        out = []
        for i, r in enumerate(rows, start=1):
            n = _index(r, i)
            part, k = ("I", n) if n <= 15 else ("II", n - 15)
            out.append({"id": f"{prefix}-{part}-{k}", "problem": _text(r, i, "problem", strip=True),
                        "answer": _text(r, i, "answer"), "source": f"{label}#{n}"})
        return out
    return convert


def _hmmt(prefix: str):
    def convert(rows, label):
        out = []
        for i, r in enumerate(rows, start=1):
            n = _index(r, i)
            out.append({"id": f"{prefix}-{n}", "problem": _text(r, i, "problem", strip=True),
                        "answer": _text(r, i, "answer", strip=True), "source": f"{label}#{n}"})
        return out
    return convert


def _subject(kind: str) -> str:
    return kind.lower().replace(" & ", "_and_").replace(" ", "_")


def _math_train(rows, label):
    """Answer = the solution's boxed content; empty or conflicting boxes are dropped (ambiguous gold)."""
    out, seen = [], {}
    for i, r in enumerate(rows, start=1):
        subject = _subject(_text(r, i, "type") or "")
        seen[subject] = seen.get(subject, 0) + 1
        boxes = all_boxed(_text(r, i, "solution") or "")
        if not boxes or not boxes[-1] or len(set(boxes)) > 1:
            continue
        ident = f"train/{subject}/{seen[subject]}"
        out.append({"id": ident, "problem": _get(r, i, "problem"), "answer": boxes[-1], "source": f"{label}#{ident}"})
    return out


SOURCES = (
    Source("train/math_train.jsonl", "DigitalLearningGmbH/MATH-lighteval", "train", 7473, _math_train),
    Source("benchmarks/math500.jsonl", "HuggingFaceH4/MATH-500", "test", 500, _math500),
    Source("benchmarks/aime25.jsonl", "MathArena/aime_2025", "train", 30, _aime("aime25")),
    Source("benchmarks/aime26.jsonl", "MathArena/aime_2026", "train", 30, _aime("aime26")),
    Source("benchmarks/hmmt_feb25.jsonl", "MathArena/hmmt_feb_2025", "train", 30, _hmmt("hmmt_feb25")),
    Source("benchmarks/hmmt_feb26.jsonl", "MathArena/hmmt_feb_2026", "train", 33, _hmmt("hmmt_feb26")),
)
NAMES = tuple(Path(s.file).stem for s in SOURCES)


def hub_rows(dataset: str, split: str) -> list[dict[str, Any]]:
    """A hub dataset's rows (the hub, or the local cache `datasets` keeps; HF_DATASETS_OFFLINE=1 for the cache)."""
    try:
        from datasets import load_dataset
    except ImportError as exc:  # pragma: no cover - datasets is a dependency of the app extra
        raise MissingDependency("building the data needs the `datasets` package: pip install -e '.[app]'") from exc
    try:
        return list(load_dataset(dataset, split=split))
    except Exception as exc:
        raise InputNotFound(f"{dataset} (split {split!r}) could not be loaded from the Hugging Face hub or its cache: "
                            f"{exc}") from exc


def check_rows(source: Source, rows: list[dict[str, str]], math500: Optional[set[str]] = None) -> None:
    """UsageError naming the file and what is wrong; returns when the rows are what the file must hold."""
    def fail(why: str):
        raise UsageError(f"{source.file} from {source.dataset}: {why}; the file is not written")

    if len(rows) != source.rows:
        fail(f"{len(rows)} rows, expected {source.rows} (the dataset changed, or is not the one named)")
    for i, r in enumerate(rows, start=1):
        if set(r) != {"id", "problem", "answer", "source"}:
            fail(f"row {i} ({r.get('id')!r}) has keys {sorted(r)}; allowed: id, problem, answer, source")
        for key, v in r.items():
            if not (isinstance(v, str) and v.strip()):
                fail(f"row {i} ({r.get('id')!r}): {key} is {'null' if v is None else repr(v)}; allowed: a non-empty "
                     "string (the dataset has no value for it)")
        if "\\boxed" in r["answer"]:
            fail(f"row {i} ({r['id']}): the answer still holds a \\boxed")
        if source.file.startswith("benchmarks/aime") and not (r["answer"].isdigit() and int(r["answer"]) <= 999):
            fail(f"row {i} ({r['id']}): AIME answer {r['answer']!r} is not an integer in 0..999")
    for key in ("id", "problem"):
        values = [r[key] for r in rows]
        if len(set(values)) != len(values):
            fail(f"a repeated {key}")
    if math500 is not None:
        overlap = math500 & {r["problem"] for r in rows}
        if overlap:
            fail(f"{len(overlap)} training problems are MATH-500 problems")


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def build(out: Path, names: Iterable[str] = NAMES,
          load: Optional[Callable[[str, str], list[dict[str, Any]]]] = None) -> dict[str, int]:
    """Build the named files under `out` (every check before any write); {file: rows}. `load(dataset, split)`
    gives a dataset's rows (default `hub_rows`)."""
    load = load or hub_rows
    _check_out(Path(out))
    wanted = [s for s in SOURCES if Path(s.file).stem in set(names)]
    built = {s.file: _convert(s, load) for s in wanted}
    math500 = None
    if "train/math_train.jsonl" in built:  # the training set must not hold an evaluation problem
        bench = SOURCES[1]
        rows = built.get(bench.file) or _convert(bench, load)
        math500 = {r["problem"] for r in rows}
    for s in wanted:
        check_rows(s, built[s.file], math500 if s.file.startswith("train/") else None)
    for s in wanted:
        _write(Path(out) / s.file, built[s.file])
    return {f: len(r) for f, r in built.items()}


def _convert(s: Source, load: Callable[[str, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    try:
        return s.convert(load(s.dataset, s.split), f"hf:{s.dataset}:{s.split}")
    except BadRow as e:
        raise UsageError(f"{s.file} from {s.dataset} (split {s.split!r}): {e}; nothing is written") from None


def _check_out(out: Path) -> None:
    """UsageError when `out`, or the nearest of its folders that exists, is not a directory (a file, say)."""
    there = next((p for p in (out, *out.parents) if p.exists()), None)
    if there is not None and not there.is_dir():
        what = "is" if there == out else f"is inside {there}, which is"
        raise UsageError(f"--out {out} {what} not a directory (a file?); allowed: a directory, new or existing")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_replay.app.paper_data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=path_arg, help="the data directory ($GRPO_REPLAY_DATA)")
    parser.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES), help="build only these files")
    args = parser.parse_args(argv)
    try:
        counts = build(Path(args.out), args.only)
    except UsageError as e:
        print(f"paper_data: {e}", file=sys.stderr)
        return 2
    for f, n in counts.items():
        print(f"{Path(args.out) / f}: {n} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
