"""Problem loading: JSONL files, directory + name, field mapping, malformed rows, benchmark resolution."""
import json
from pathlib import Path

import pytest

from grpo_replay.data import BENCHMARKS, DataError, Problem, default_data_dir, load_problems, resolve_benchmark
from helpers import SHARED_DATA

SHARED = SHARED_DATA


def write_lines(path: Path, lines) -> Path:
    with open(path, "wb") as fh:
        for line in lines:
            fh.write((json.dumps(line) if isinstance(line, dict) else line).encode() if not isinstance(line, bytes) else line)
            fh.write(b"\n")
    return path


def row(i, **kw):
    return {"id": f"p{i}", "problem": f"What is {i}+{i}?", "answer": str(2 * i), "source": "unit", **kw}


def test_load_jsonl_file_and_limit(tmp_path):
    f = write_lines(tmp_path / "set.jsonl", [row(1), "", row(2), row(3)])  # a blank line is ignored
    probs = load_problems(f, split="test")
    assert probs == [Problem("p1", "What is 1+1?", "2", "unit"), Problem("p2", "What is 2+2?", "4", "unit"),
                     Problem("p3", "What is 3+3?", "6", "unit")]
    assert [p.id for p in load_problems(str(f), limit=2)] == ["p1", "p2"]
    assert probs.skipped == []


def test_directory_plus_name_and_split(tmp_path):
    write_lines(tmp_path / "mine.jsonl", [row(1)])
    write_lines(tmp_path / "train.jsonl", [row(2)])
    assert load_problems(tmp_path, name="mine")[0].id == "p1"
    assert load_problems(tmp_path, split="train")[0].id == "p2"
    with pytest.raises(FileNotFoundError, match="test.jsonl"):
        load_problems(tmp_path, split="test")


def test_field_mapping_defaults_and_numbers(tmp_path):
    f = write_lines(tmp_path / "gsm.jsonl", [{"question": "Q?", "final": 42}])
    (p,) = load_problems(f, fields={"problem": "question", "answer": "final"})
    assert p == Problem(id="gsm-1", problem="Q?", answer="42", source="gsm.jsonl")
    with pytest.raises(ValueError, match="unknown field 'prompt'"):
        load_problems(f, fields={"prompt": "question"})


@pytest.mark.parametrize(
    "bad, reason",
    [
        (b"{not json", "invalid JSON"),
        (b'{"problem": "caf\xe9", "answer": "1"}', "not valid UTF-8"),
        (json.dumps({"problem": "x"}), "missing field 'answer'"),
        (json.dumps({"problem": "x", "answer": "  "}), "empty field 'answer'"),
        (json.dumps({"problem": "x", "answer": ["1"]}), "must be a string or number"),
        (json.dumps([1, 2]), "expected a JSON object"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, bad, reason):
    f = write_lines(tmp_path / "bad.jsonl", [row(1), bad, row(3)])
    with pytest.raises(DataError, match=reason) as info:
        load_problems(f)
    assert f"{f}:2:" in str(info.value) and info.value.line == 2
    assert isinstance(info.value, ValueError)
    with pytest.warns(UserWarning, match="skipped 1 malformed"):
        probs = load_problems(f, on_error="skip")
    assert [p.id for p in probs] == ["p1", "p3"]
    assert len(probs.skipped) == 1 and probs.skipped[0].line == 2 and reason in probs.skipped[0].reason


def test_argument_errors(tmp_path):
    f = write_lines(tmp_path / "a.jsonl", [row(1)])
    with pytest.raises(ValueError, match="on_error must be one of raise, skip"):
        load_problems(f, on_error="ignore")
    with pytest.raises(ValueError, match="split must be one of train, test"):
        load_problems(f, split="dev")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_problems(tmp_path / "missing.jsonl")


def test_resolve_benchmark(tmp_path, monkeypatch):
    write_lines(tmp_path / "aime25.jsonl", [row(1)])
    assert resolve_benchmark("aime25", tmp_path) == tmp_path / "aime25.jsonl"
    (tmp_path / "benchmarks").mkdir()
    write_lines(tmp_path / "benchmarks" / "math500.jsonl", [row(1)])
    assert resolve_benchmark("math500", tmp_path) == tmp_path / "benchmarks" / "math500.jsonl"
    with pytest.raises(FileNotFoundError, match="hmmt_feb25"):
        resolve_benchmark("hmmt_feb25", tmp_path)
    with pytest.raises(ValueError, match="unknown benchmark 'gsm8k'.*math500, aime25"):
        resolve_benchmark("gsm8k", tmp_path)
    monkeypatch.setenv("GRPO_REPLAY_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    assert resolve_benchmark("aime25") == tmp_path / "aime25.jsonl"


@pytest.mark.skipif(not (SHARED / "benchmarks").is_dir(), reason="shared benchmark data not present")
def test_shared_benchmarks_load(monkeypatch):
    monkeypatch.delenv("GRPO_REPLAY_DATA", raising=False)
    counts = {name: len(load_problems(resolve_benchmark(name, SHARED / "benchmarks"), split="test")) for name in BENCHMARKS}
    assert counts == {"math500": 500, "aime25": 30, "aime26": 30, "hmmt_feb25": 30, "hmmt_feb26": 33}
    # Default data dir: ../shared/data relative to the checkout.
    assert resolve_benchmark("aime25").name == "aime25.jsonl"
