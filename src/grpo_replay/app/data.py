"""Problem loading shared by the trainer and the evaluation harness.

A problem set comes from one of three places:

* a JSONL file (one object per line with ``problem`` and ``answer``, optionally ``id`` and ``source``);
* a directory plus a name: ``<dir>/<name>.jsonl`` (or ``<dir>/<split>.jsonl`` when no name is given);
* a Hugging Face dataset name, loaded with :func:`datasets.load_dataset` (needs the hub or a local cache);
  ``DATASET:CONFIG`` names a config (``openai/gsm8k:main``).

A ``.json`` file may also hold one array of such objects. Field names of the source can be mapped onto ours with
``fields={"problem": "question", ...}``; without a mapping, a row that lacks ``problem`` or ``answer`` is read with
the names the common math sets use instead (:data:`ALIASES`: GSM8K's ``question``, MATH's ``solution`` with its
last ``\\boxed{}``), and a GSM8K answer (worked solution, then ``#### 72``) becomes its final number.
A malformed row raises :class:`DataError` naming the file and line; with ``on_error="skip"`` such rows are
skipped instead, counted in :attr:`ProblemList.skipped` and reported with a warning.
"""
from __future__ import annotations

import decimal
import json
import os
import re
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Union

from ..errors import InputNotFound, MissingDependency, UsageError
from .answers import extract_boxed

BENCHMARKS = ("math500", "aime25", "aime26", "hmmt_feb25", "hmmt_feb26")
"""The paper's five evaluation benchmarks, in reporting order."""

DATA_ENV = "GRPO_REPLAY_DATA"
FIELDS = ("id", "problem", "answer", "source")
REQUIRED_FIELDS = ("problem", "answer")  # id and source get defaults (file stem + line number / file name)
ON_ERROR = ("raise", "skip")
SPLITS = ("train", "test")
# Other sets' names for our fields, tried in order when a row lacks ours and `fields` does not map it: GSM8K and
# many RLVR sets say "question", TRL-style sets "prompt" (a string; a chat-message list is refused as not a string),
# MATH (hendrycks) has only a worked "solution", whose last \boxed{} is the answer.
ALIASES = {"problem": ("question", "prompt", "query"), "answer": ("solution",)}
_GSM8K_FINAL = re.compile(r"####\s*(\S.*?)\s*$", re.S)
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")

PathLike = Union[str, "os.PathLike[str]"]


class DataError(UsageError):
    """A malformed data row; the message names the file (or dataset) and the 1-based line (or row) number."""

    def __init__(self, where: str, line: Optional[int], reason: str):
        self.where, self.line, self.reason = where, line, reason
        loc = f"{where}:{line}" if line is not None else where
        super().__init__(f"{loc}: {reason}")


@dataclass(frozen=True)
class Problem:
    """One math problem with its gold final answer (a LaTeX string, without ``\\boxed{}``)."""

    id: str
    problem: str
    answer: str
    source: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


class ProblemList(list):
    """A ``list[Problem]`` that also carries the rows skipped under ``on_error="skip"``."""

    def __init__(self, items: Iterable[Problem] = (), skipped: Optional[list[DataError]] = None):
        super().__init__(items)
        self.skipped: list[DataError] = list(skipped or [])


# ----------------------------------------------------------------------------------------------------------
# Locating data


def default_data_dir() -> Optional[Path]:
    """``$GRPO_REPLAY_DATA`` (the one place data is looked for when no path is given), or None when unset."""
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser() if env else None


def resolve_benchmark(name: str, data_dir: Optional[PathLike] = None) -> Path:
    """The JSONL file of benchmark ``name``: ``<data_dir>/<name>.jsonl`` (or ``<data_dir>/benchmarks/<name>.jsonl``).

    The five paper benchmarks are listed in :data:`BENCHMARKS`; any other name is accepted when its file
    exists, so a user can drop in an extra benchmark. ``data_dir`` defaults to :func:`default_data_dir`.
    """
    base = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    if base is None:
        raise InputNotFound(
            f"no data directory for benchmark {name!r}: pass data_dir (--data-dir) or set ${DATA_ENV}"
        )
    # A data directory keeps benchmarks in a subfolder; accept both that root and the folder itself.
    candidates = [base / f"{name}.jsonl", base / "benchmarks" / f"{name}.jsonl"]
    for path in candidates:
        if path.is_file():
            return path
    known = f"known benchmarks: {', '.join(BENCHMARKS)}"
    if name not in BENCHMARKS:
        raise UsageError(f"unknown benchmark {name!r} (no file {candidates[0]}); {known}")
    raise InputNotFound(f"benchmark {name!r}: none of {', '.join(map(str, candidates))} exists")


# ----------------------------------------------------------------------------------------------------------
# Loading


def load_problems(
    spec: PathLike,
    split: str = "train",
    limit: Optional[int] = None,
    *,
    name: Optional[str] = None,
    fields: Optional[Mapping[str, str]] = None,
    on_error: str = "raise",
) -> ProblemList:
    """Load problems from a JSONL file, ``<directory>/<name>.jsonl``, or a Hugging Face dataset.

    Args:
        spec: a ``.jsonl`` file, a directory, or a Hugging Face dataset name (e.g. ``HuggingFaceH4/MATH-500``).
        split: ``"train"`` or ``"test"``; picks ``<dir>/<split>.jsonl`` for a directory without ``name``
            and the split of a Hugging Face dataset.
        limit: keep at most this many problems (the first ones, in file order).
        name: file stem inside a directory spec, or the config name of a Hugging Face dataset.
        fields: our field name -> source field name, e.g. ``{"problem": "question", "answer": "gt"}``.
        on_error: ``"raise"`` (default) raises :class:`DataError` at the first malformed row; ``"skip"``
            skips malformed rows and records them in ``result.skipped``.
    """
    if split not in SPLITS:
        raise UsageError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if on_error not in ON_ERROR:
        raise UsageError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    if limit is not None and limit < 0:
        raise UsageError(f"limit must be >= 0 or None, got {limit}")
    mapping = _field_mapping(fields)

    path = Path(spec).expanduser()  # `~/data.jsonl` from a config file or --set, which no shell expanded
    array = False  # a .json file holding one array: ids by position, since its elements may share a line
    if path.is_dir():
        stem = name or split
        path = path / f"{stem}.jsonl"
        if not path.is_file():
            raise InputNotFound(f"{path} does not exist (directory {spec} + name {stem!r})")
        rows = _jsonl_rows(path)
        where = str(path)
    elif path.is_file():
        array = _is_json_array(path)
        rows, where = (_json_array_rows(path) if array else _jsonl_rows(path)), str(path)
    elif str(spec).endswith((".jsonl", ".json")) or (os.sep in str(spec) and path.parent.is_dir()):
        # Looks like a local path that is missing; do not silently try the hub with it.
        raise InputNotFound(f"data file {spec} does not exist")
    else:
        # `openai/gsm8k:main`: a dataset with several configs needs one named, and --data is a single string.
        dataset, _, config = str(spec).partition(":")
        rows, where = _hf_rows(dataset, name or config or None, split), f"hf:{spec}"

    local = path.suffix in (".jsonl", ".json")
    default_source = path.name if local else str(spec)
    id_prefix = path.stem if local else str(spec).replace("/", "_").replace(":", "_")
    problems = ProblemList()
    first_line: dict[str, int] = {}
    for position, (line_no, row) in enumerate(rows, start=1):
        if limit is not None and len(problems) >= limit:
            break
        try:
            if isinstance(row, DataError):
                raise row
            p = _to_problem(row, mapping, where, line_no, default_source, id_prefix, position if array else line_no)
            # Completions, grades and caches are keyed by id: two problems with one id would share them.
            if p.id in first_line:
                raise DataError(where, line_no, f"id {p.id!r} repeats the one on line {first_line[p.id]}; ids must be unique")
            first_line[p.id] = line_no
            problems.append(p)
        except DataError as err:
            if on_error == "raise":
                raise
            problems.skipped.append(err)
    if problems.skipped:
        first = "; ".join(str(e) for e in problems.skipped[:3])
        warnings.warn(f"{where}: skipped {len(problems.skipped)} malformed row(s): {first}", stacklevel=2)
    return problems


def _field_mapping(fields: Optional[Mapping[str, str]]) -> dict[str, str]:
    mapping = {f: f for f in FIELDS}
    for ours, theirs in (fields or {}).items():
        if ours not in FIELDS:
            raise UsageError(f"fields: unknown field {ours!r}; allowed: {', '.join(FIELDS)}")
        mapping[ours] = theirs
    return mapping


def _is_json_array(path: Path) -> bool:
    """A `.json` file whose first non-blank character is `[` (after an optional UTF-8 byte-order mark)."""
    if path.suffix != ".json":
        return False
    with open(path, "rb") as fh:
        head = fh.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()
    return head.startswith(b"[")


def _json_array_rows(path: Path) -> Iterable[tuple[int, Any]]:
    """Yield (line on which the element starts, element) for a file holding one JSON array, so an error names the
    line of the bad object as for JSONL. Broken JSON raises DataError even with on_error="skip": nothing after it
    can be read, and skipping would silently drop the rest of the file."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(str(path), raw[: exc.start].count(b"\n") + 1,
                        f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    dec, ws = json.JSONDecoder(parse_float=decimal.Decimal, parse_constant=decimal.Decimal), re.compile(r"\s*")
    seen, line = 0, 1  # lines are counted forward from the last position, never from the start again

    def line_at(i: int) -> int:
        nonlocal seen, line
        line += text.count("\n", seen, i)
        seen = i
        return line

    def broken(i: int, what: str) -> DataError:
        return DataError(str(path), line_at(i), f"invalid JSON ({what})")

    i = ws.match(text, text.index("[") + 1).end()
    if text.startswith("]", i):
        i += 1
    else:
        while True:
            try:
                obj, end = dec.raw_decode(text, i)
            except json.JSONDecodeError as exc:
                raise DataError(str(path), exc.lineno, f"invalid JSON ({exc.msg}, column {exc.colno})") from None
            except RecursionError:
                raise broken(i, "nested too deeply") from None
            yield line_at(i), obj
            i = ws.match(text, end).end()
            if text.startswith("]", i):
                i += 1
                break
            if not text.startswith(",", i):
                raise broken(i, "expected ',' or ']' after an array element")
            i = ws.match(text, i + 1).end()
            if text.startswith("]", i):
                raise broken(i, "a ',' before the closing ']'")
    if text[i:].strip():
        raise broken(ws.match(text, i).end(), "text after the array's closing ']'")


def _jsonl_rows(path: Path) -> Iterable[tuple[int, Any]]:
    """Yield (line number, parsed object or DataError); blank lines are skipped silently."""
    with open(path, "rb") as fh:  # bytes, so a bad encoding is reported per line rather than per file
        for line_no, raw in enumerate(fh, start=1):
            if line_no == 1:  # editors on Windows save UTF-8 with a byte-order mark; it is not part of the JSON
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield line_no, DataError(str(path), line_no, f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            if not text.strip():
                continue
            try:
                yield line_no, json.loads(text, parse_float=decimal.Decimal, parse_constant=decimal.Decimal)
            except json.JSONDecodeError as exc:
                yield line_no, DataError(str(path), line_no, f"invalid JSON ({exc.msg}, column {exc.colno})")
            except RecursionError:
                yield line_no, DataError(str(path), line_no, "invalid JSON (nested too deeply)")


def _hf_rows(dataset: str, name: Optional[str], split: str) -> Iterable[tuple[int, Any]]:
    """Rows of a Hugging Face dataset (not exercised offline; needs the hub or a warm cache)."""
    try:
        from datasets import load_dataset
    except ImportError as exc:  # pragma: no cover - datasets is a core dependency
        raise MissingDependency("loading a Hugging Face dataset needs the `datasets` package") from exc
    try:
        ds = load_dataset(dataset, name, split=split)
    except Exception as exc:  # pragma: no cover - network / hub errors
        raise InputNotFound(
            f"{dataset!r} is neither a local file/directory nor a loadable Hugging Face dataset "
            f"(split {split!r}): {exc}"
        ) from exc
    for index, row in enumerate(ds, start=1):  # pragma: no cover
        yield index, row


def _to_problem(
    row: Any, mapping: dict[str, str], where: str, line: int, default_source: str, id_prefix: str, number: int
) -> Problem:
    if not isinstance(row, dict):
        raise DataError(where, line, f"expected a JSON object, got {type(row).__name__}")
    values: dict[str, str] = {}
    for ours in FIELDS:
        theirs = mapping[ours]
        if theirs == ours and theirs not in row:  # not mapped by the caller: the common sets' names for it
            theirs = next((a for a in ALIASES.get(ours, ()) if a in row), theirs)
        value = row.get(theirs)
        if value is None:
            if ours in REQUIRED_FIELDS:
                if theirs in row:
                    raise DataError(where, line, f"field {theirs!r} (our {ours!r}) is null")
                also = ALIASES.get(ours, ()) if mapping[ours] == ours else ()
                raise DataError(where, line, f"missing field {theirs!r} (our {ours!r})"
                                + (f"; also looked for {', '.join(map(repr, also))}" if also else "")
                                + f"; the row has {', '.join(map(repr, list(row)[:12])) or 'no fields'}")
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float, decimal.Decimal)):
            raise DataError(where, line, f"field {theirs!r} must be a string or number, got {type(value).__name__}")
        values[ours] = _number_text(value, theirs, ours, where, line) if not isinstance(value, str) else value
        if ours == "answer":
            values[ours] = _final_answer(values[ours], from_solution=theirs == "solution" and mapping[ours] == ours,
                                         where=where, line=line)
        if ours in REQUIRED_FIELDS and not values[ours].strip():
            raise DataError(where, line, f"empty field {theirs!r} (our {ours!r})")
    return Problem(
        id=values.get("id", f"{id_prefix}-{number}"),
        problem=values["problem"],
        answer=values["answer"].strip(),
        source=values.get("source", default_source),
    )


def _number_text(value: Any, theirs: str, ours: str, where: str, line: int) -> str:
    """A number of a row as the text a grader compares: written out in full, never in exponent form (str(1e21) is
    '1e+21', which no \\boxed{1000000000000000000000} matches). JSON rows are parsed with their numbers as
    Decimal, so the digits the file holds are kept; NaN and Infinity are no answer and are refused."""
    d = value if isinstance(value, decimal.Decimal) else decimal.Decimal(repr(value) if isinstance(value, float) else value)
    if not d.is_finite():
        raise DataError(where, line, f"field {theirs!r} (our {ours!r}) is {value}; allowed: a finite number or a string")
    return format(d, "f")


def _final_answer(text: str, from_solution: bool, where: str, line: int) -> str:
    """The gold final answer in `text`: the last \\boxed{} of a MATH worked solution, the number after GSM8K's
    `####` (thousands commas dropped: graders compare `1,080` with a model's `1080` as different strings), else text."""
    if from_solution:
        boxed = extract_boxed(text)
        if boxed is None:
            raise DataError(where, line, "field 'solution' (our 'answer', read from a worked solution) has no \\boxed{} answer")
        return boxed
    m = _GSM8K_FINAL.search(text)
    if m and "\n" not in m.group(1):
        final = m.group(1).strip()
        return final.replace(",", "") if _THOUSANDS.fullmatch(final) else final
    return text
