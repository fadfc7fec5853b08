"""Problem loading: JSONL files, directory + name, field mapping, malformed rows, benchmark resolution."""
import json
import re
from pathlib import Path

import pytest

from grpo_replay.app.data import BENCHMARKS, DataError, Problem, default_data_dir, load_problems, resolve_benchmark
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


# --- the forms data arrives in: a byte-order mark, a JSON array, other sets' field names ---------------------
GSM8K_RAW = {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
                         "May. How many clips did Natalia sell altogether in April and May?",
             "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
                       "altogether in April and May.\n#### 72"}  # the first row of openai/gsm8k, as the hub has it


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_row(tmp_path):
    f = tmp_path / "bom.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps(row(1)).encode() + b"\r\n" + json.dumps(row(2)).encode() + b"\r\n")
    assert [p.id for p in load_problems(f)] == ["p1", "p2"]
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps([row(1)]).encode())
    g = f.rename(tmp_path / "bom.json")
    assert [p.id for p in load_problems(g)] == ["p1"]


def test_a_json_file_holding_one_array(tmp_path):
    f = tmp_path / "set.json"
    f.write_text("[\n" + ",\n".join(json.dumps(row(i)) for i in (1, 2, 3)) + "\n]\n")
    assert load_problems(f) == load_problems(write_lines(tmp_path / "set.jsonl", [row(1), row(2), row(3)]))
    assert [p.id for p in load_problems(f, limit=2)] == ["p1", "p2"]
    # a malformed element names the line it starts on, and the skip policy skips it
    f.write_text("[\n" + json.dumps(row(1)) + ",\n" + json.dumps({"problem": "x"}) + ",\n" + json.dumps(row(3)) + "]")
    with pytest.raises(DataError, match=rf"{f}:3: missing field 'answer'"):
        load_problems(f)
    with pytest.warns(UserWarning, match="skipped 1 malformed"):
        assert [p.id for p in load_problems(f, on_error="skip")] == ["p1", "p3"]
    # broken JSON stops the array: an error even when skipping, since the rest of the file cannot be read
    f.write_text("[\n" + json.dumps(row(1)) + ",\n" + '{"problem": "x" "answer": "1"},\n' + json.dumps(row(3)) + "\n]")
    for policy in ("raise", "skip"):
        with pytest.raises(DataError, match=rf"{f}:3: invalid JSON \(Expecting ',' delimiter"):
            load_problems(f, on_error=policy)
    f.write_text("[" + json.dumps(row(1)) + " " + json.dumps(row(2)) + "]")
    with pytest.raises(DataError, match="expected ',' or ']' after an array element"):
        load_problems(f)
    for text, what in (("[" + json.dumps(row(1)) + ",]", "a ',' before the closing ']'"),
                       ("[" + json.dumps(row(1)) + "] [" + json.dumps(row(2)) + "]", "text after the array's closing ']'"),
                       ("[" + json.dumps(row(1)) + "]\ngarbage", "text after the array's closing ']'")):
        f.write_text(text)
        with pytest.raises(DataError, match=re.escape(what)):
            load_problems(f, on_error="skip")
    f.write_text(" [ ]\n")
    assert load_problems(f) == []


def test_a_one_line_json_array_gets_one_id_per_element(tmp_path):
    """json.dump(rows) writes one line: ids by line would all be equal, and eval keys completions by id."""
    f = tmp_path / "min.json"
    f.write_text(json.dumps([{"problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(3)]))
    assert [p.id for p in load_problems(f)] == ["min-1", "min-2", "min-3"]


def test_a_repeated_id_is_a_data_error_naming_both_lines(tmp_path):
    f = write_lines(tmp_path / "dup.jsonl", [row(1), row(2), row(1, problem="other")])
    with pytest.raises(DataError, match=rf"{f}:3: id 'p1' repeats the one on line 1; ids must be unique"):
        load_problems(f)
    with pytest.warns(UserWarning, match="skipped 1 malformed"):
        assert [p.id for p in load_problems(f, on_error="skip")] == ["p1", "p2"]


def test_a_large_json_array_loads_in_linear_time(tmp_path):
    import time

    f = tmp_path / "big.json"
    f.write_text("[\n" + ",\n".join(json.dumps(row(i)) for i in range(20_000)) + "\n]\n")
    t0 = time.perf_counter()
    probs = load_problems(f)
    assert len(probs) == 20_000 and probs[-1].id == "p19999"
    assert time.perf_counter() - t0 < 10  # its first version recounted every line per element: 14 s at 10k rows, 195 s at 40k


def test_gsm8k_as_the_hub_has_it_loads_with_its_final_number():
    """GSM8K says `question`, and its `answer` is a worked solution ending in `#### 72`."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        rows = [GSM8K_RAW, {"question": "Q?", "answer": "5 * 216 = 1,080\n#### 1,080"},
                {"question": "Q2?", "answer": "so\n#### -3.5"}]
        (p, q, r) = load_problems(write_lines(Path(d) / "gsm8k.jsonl", rows))
    assert (p.problem, p.answer) == (GSM8K_RAW["question"], "72")
    assert q.answer == "1080" and r.answer == "-3.5"  # thousands commas dropped, as in ../shared/data's gsm8k_train
    # the normalized copy in ../shared/data reads the same: its first row is this one
    if (SHARED / "train" / "gsm8k_train.jsonl").exists():
        first = load_problems(SHARED / "train" / "gsm8k_train.jsonl", limit=1)[0]
        assert (first.problem, first.answer) == (p.problem, p.answer)


def test_math_worked_solution_gives_its_last_boxed_answer(tmp_path):
    f = write_lines(tmp_path / "math.jsonl", [
        {"problem": "P?", "solution": "First $\\boxed{1}$ is wrong; so the answer is $\\boxed{\\frac{1}{2}}$."},
        {"problem": "P2?", "solution": "no box here"}])
    with pytest.raises(DataError, match=rf"{f}:2: field 'solution' \(our 'answer', read from a worked solution\) has no"):
        load_problems(f)
    with pytest.warns(UserWarning):
        (p,) = load_problems(f, on_error="skip")
    assert p.answer == "\\frac{1}{2}"
    # our own field wins over an alias, and an explicit mapping is taken as given (no #### or \boxed rewriting of it)
    g = write_lines(tmp_path / "both.jsonl", [{"problem": "P", "question": "Q", "answer": "7", "solution": "$\\boxed{8}$"}])
    assert (load_problems(g)[0].problem, load_problems(g)[0].answer) == ("P", "7")
    h = write_lines(tmp_path / "mapped.jsonl", [{"q": "Q", "sol": "$\\boxed{8}$"}])
    assert load_problems(h, fields={"problem": "q", "answer": "sol"})[0].answer == "$\\boxed{8}$"


def test_a_missing_or_null_field_says_which_and_what_the_row_has(tmp_path):
    f = write_lines(tmp_path / "x.jsonl", [{"text": "x", "label": 1}])
    with pytest.raises(DataError, match=r"missing field 'problem' \(our 'problem'\); also looked for 'question', "
                                         r"'prompt', 'query'; the row has 'text', 'label'"):
        load_problems(f)
    g = write_lines(tmp_path / "y.jsonl", [{"problem": "x", "answer": None}])
    with pytest.raises(DataError, match=rf"{g}:1: field 'answer' \(our 'answer'\) is null"):
        load_problems(g)
    h = write_lines(tmp_path / "z.jsonl", [{"q": "x", "answer": "1"}])
    with pytest.raises(DataError, match=r"z.jsonl:1: missing field 'qq' \(our 'problem'\); the row has 'q', 'answer'$"):
        load_problems(h, fields={"problem": "qq"})  # an explicit mapping: no aliases looked for


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
    # No path given: $GRPO_REPLAY_DATA is the one place looked in; unset, the error says what to give.
    with pytest.raises(FileNotFoundError, match=r"--data-dir.*GRPO_REPLAY_DATA"):
        resolve_benchmark("aime25")
    monkeypatch.setenv("GRPO_REPLAY_DATA", str(SHARED))
    assert resolve_benchmark("aime25") == SHARED / "benchmarks" / "aime25.jsonl"


def test_a_hub_dataset_with_a_config_is_named_dataset_colon_config(monkeypatch):
    """Offline, so datasets.load_dataset is replaced by a recorder; the rows are GSM8K's shape as the hub serves it."""
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        return [GSM8K_RAW]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    (p,) = load_problems("openai/gsm8k:main")
    assert calls == [("openai/gsm8k", "main", "train")]
    assert (p.id, p.answer, p.source) == ("openai_gsm8k_main-1", "72", "openai/gsm8k:main")
    load_problems("HuggingFaceH4/MATH-500", split="test")
    assert calls[-1] == ("HuggingFaceH4/MATH-500", None, "test")


def test_a_numeric_answer_is_written_out_in_full_and_grades_right(tmp_path):
    from grpo_replay.eval.grading import grade

    path = tmp_path / "n.jsonl"
    path.write_text('{"problem": "p", "answer": 1e21}\n{"problem": "q", "answer": 1.5e-7}\n'
                    '{"problem": "r", "answer": 0.1}\n{"problem": "s", "answer": 12345678901234567890123}\n')
    answers = [p.answer for p in load_problems(path)]
    assert answers == ["1000000000000000000000", "0.00000015", "0.1", "12345678901234567890123"]
    assert grade(r"\boxed{1000000000000000000000}", answers[0])
    array = tmp_path / "n.json"
    array.write_text('[{"problem": "p", "answer": 1E+21}]')
    assert load_problems(array)[0].answer == "1000000000000000000000"


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_a_nan_or_infinite_answer_is_refused(tmp_path, text):
    path = tmp_path / "n.jsonl"
    path.write_text('{"problem": "p", "answer": 2}\n{"problem": "q", "answer": %s}\n' % text)
    with pytest.raises(DataError, match=f"n.jsonl:2: field 'answer' \\(our 'answer'\\) is {text}; allowed: a finite number"):
        load_problems(path)
    array = tmp_path / "n.json"
    array.write_text('[{"problem": "q", "answer": %s}]' % text)
    with pytest.raises(DataError, match=f"is {text}; allowed"):
        load_problems(array)
