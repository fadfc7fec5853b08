"""`python -m grpo_replay.app.paper_data` builds the paper recipe's data directory from the hub datasets it names:
here from local copies laid out as those datasets (the hub is not reachable), through the real `load_dataset` call,
checked against the stored files; a source that changed is refused before anything is written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_replay.app import paper_data as pd
from grpo_replay.app.data import BENCHMARKS, load_problems
from helpers import SHARED_DATA

pytestmark = pytest.mark.skipif(SHARED_DATA is None or not Path(SHARED_DATA).is_dir(), reason="no stored data")
SUBJECTS = {"counting_and_probability": "Counting & Probability", "intermediate_algebra": "Intermediate Algebra",
            "number_theory": "Number Theory"}


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _hub_layout(root: Path) -> None:
    """The six datasets as `load_dataset(<name>, split=...)` finds them in a local directory of that name, in their
    hub fields: MATH-500's unique_id/answer, MathArena's problem_idx numbering I-1..15 then II-1..15, MATH train's
    worked solution and subject (plus 27 solutions with an empty or conflicting box, which must be dropped)."""
    def put(name: str, split: str, rows: list[dict]) -> None:
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    bench = Path(SHARED_DATA) / "benchmarks"
    put("HuggingFaceH4/MATH-500", "test", [{"unique_id": r["id"], "problem": r["problem"], "answer": r["answer"]}
                                           for r in _read(bench / "math500.jsonl")])
    for stem, name in (("aime25", "aime_2025"), ("aime26", "aime_2026")):
        rows = []
        for r in _read(bench / f"{stem}.jsonl"):
            _, part, k = r["id"].split("-")
            rows.append({"problem_idx": int(k) + (15 if part == "II" else 0), "problem": r["problem"],
                         "answer": int(r["answer"])})
        put(f"MathArena/{name}", "train", rows)
    for stem, name in (("hmmt_feb25", "hmmt_feb_2025"), ("hmmt_feb26", "hmmt_feb_2026")):
        put(f"MathArena/{name}", "train", [{"problem_idx": int(r["id"].rsplit("-", 1)[1]), "problem": r["problem"],
                                            "answer": r["answer"]} for r in _read(bench / f"{stem}.jsonl")])
    train = []
    for r in _read(Path(SHARED_DATA) / "train/math_train.jsonl"):
        subject = r["id"].split("/")[1]
        kind = SUBJECTS.get(subject, subject.capitalize())
        train.append({"problem": r["problem"], "solution": f"Worked out, so it is $\\boxed{{{r['answer']}}}$.",
                      "type": kind, "level": "Level 1"})
    train += [{"problem": f"empty box {i}", "solution": "so $\\boxed{}$.", "type": "Algebra", "level": "Level 1"}
              for i in range(2)]
    train += [{"problem": f"two answers {i}", "solution": "$\\boxed{1}$ or $\\boxed{2}$", "type": "Geometry",
               "level": "Level 1"} for i in range(25)]
    put("DigitalLearningGmbH/MATH-lighteval", "train", train)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    _hub_layout(root)
    return root


def test_builds_every_file_through_load_dataset_as_stored(hub, tmp_path, monkeypatch, capsys):
    import datasets

    monkeypatch.chdir(hub)  # load_dataset("MathArena/aime_2025") reads the local directory of that name
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    out = tmp_path / "data"
    assert pd.main(["--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{out}/train/math_train.jsonl: 7473 rows" in printed
    for name in BENCHMARKS:
        ours, stored = _read(out / f"benchmarks/{name}.jsonl"), _read(Path(SHARED_DATA) / f"benchmarks/{name}.jsonl")
        assert [(r["id"], r["problem"], r["answer"]) for r in ours] == \
            [(r["id"], r["problem"], r["answer"]) for r in stored], name
        assert all(set(r) == {"id", "problem", "answer", "source"} for r in ours)
        # the loaders the recipe uses read it: the evaluation's benchmark directory
        assert len(load_problems(out / "benchmarks", name=name, split="test")) == len(stored)
    ours = _read(out / "train/math_train.jsonl")
    stored = _read(Path(SHARED_DATA) / "train/math_train.jsonl")
    assert sorted((r["problem"], r["answer"]) for r in ours) == sorted((r["problem"], r["answer"]) for r in stored)
    assert len(load_problems(out / "train/math_train.jsonl")) == 7473


def test_a_changed_source_is_refused_and_nothing_is_written(tmp_path):
    rows = {"MathArena/hmmt_feb_2025": [{"problem_idx": i, "problem": f"p{i}", "answer": "1"} for i in range(1, 30)]}
    out = tmp_path / "data"
    with pytest.raises(pd.UsageError, match=r"benchmarks/hmmt_feb25.jsonl from MathArena/hmmt_feb_2025: 29 rows, "
                                            r"expected 30"):
        pd.build(out, ["hmmt_feb25"], load=lambda name, split: rows[name])
    assert not out.exists()
    aime = [{"problem_idx": i, "problem": f"p{i}", "answer": 1000 + i} for i in range(1, 31)]
    with pytest.raises(pd.UsageError, match=r"AIME answer '1001' is not an integer in 0..999"):
        pd.build(out, ["aime25"], load=lambda name, split: aime)
    short = [{"problem": "same", "solution": "$\\boxed{1}$", "type": "Algebra"}] * 1
    with pytest.raises(pd.UsageError, match="1 rows, expected 7473"):
        pd.build(out, ["math_train"], load=lambda name, split: short if "MATH-lighteval" in name else
                 [{"unique_id": "u", "problem": "other", "answer": "1"}])
    assert not out.exists()


def test_training_problems_that_are_math500_problems_are_refused():
    src = pd.SOURCES[0]
    rows = [{"id": f"t{i}", "problem": f"q{i}", "answer": "1", "source": "s"} for i in range(src.rows)]
    pd.check_rows(src, rows, math500={"q5"} - {"q5"})
    with pytest.raises(pd.UsageError, match="1 training problems are MATH-500 problems"):
        pd.check_rows(src, rows, math500={"q5"})


def test_without_the_hub_the_error_names_the_dataset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(pd.InputNotFound, match="MathArena/aime_2025 .split 'train'. could not be loaded"):
        pd.hub_rows("MathArena/aime_2025", "train")


@pytest.mark.parametrize("name,dataset,rows", [
    ("math500", "HuggingFaceH4/MATH-500",
     [{"unique_id": f"u{i}", "problem": f"p{i}", "answer": None if i == 7 else "1"} for i in range(500)]),
    ("hmmt_feb25", "MathArena/hmmt_feb_2025",
     [{"problem_idx": i, "problem": f"p{i}", **({} if i == 8 else {"answer": "2"})} for i in range(1, 31)]),
])
def test_a_null_or_missing_answer_is_refused_not_written_as_none(tmp_path, name, dataset, rows):
    out = tmp_path / "data"
    with pytest.raises(pd.UsageError, match=r"answer|'answer'") as e:
        pd.build(out, [name], load=lambda n, split: rows)
    assert "None" not in str(e.value).replace("is null", "") and dataset in str(e.value)
    assert ("row 8: field 'answer' is missing" if name == "hmmt_feb25" else "row 8 ('u7'): answer is null") in str(e.value)
    assert not out.exists()
    # the checks themselves refuse a null answer (a converter that let one through)
    row = {"id": "x", "problem": "p", "answer": None, "source": "s"}
    with pytest.raises(pd.UsageError, match=r"row 1 \('x'\): answer is null"):
        pd.check_rows(pd.Source("benchmarks/x.jsonl", "d", "test", 1, None), [row])


def test_bad_local_rows_and_an_out_that_is_a_file_exit_2_naming_the_field(tmp_path, monkeypatch, capsys):
    aime = [{"problem_idx": "I-3" if i == 3 else i, "problem": f"p{i}", "answer": i} for i in range(1, 31)]
    monkeypatch.setattr(pd, "hub_rows", lambda name, split: aime)
    assert pd.main(["--out", str(tmp_path / "data"), "--only", "aime25"]) == 2
    err = capsys.readouterr().err
    assert "benchmarks/aime25.jsonl from MathArena/aime_2025" in err
    assert "row 3: field 'problem_idx' is 'I-3'; allowed: a whole number" in err
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for out in (a_file, a_file / "sub"):
        assert pd.main(["--out", str(out), "--only", "aime25"]) == 2
        err = capsys.readouterr().err
        assert f"--out {out} " in err and "not a directory" in err
    assert a_file.read_text() == "x"


def test_out_with_a_tilde_is_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    aime = [{"problem_idx": i, "problem": f"p{i}", "answer": i} for i in range(1, 31)]
    monkeypatch.setattr(pd, "hub_rows", lambda name, split: aime)
    assert pd.main(["--out", "~/d", "--only", "aime25"]) == 0
    assert (tmp_path / "home/d/benchmarks/aime25.jsonl").is_file() and not (tmp_path / "~").exists()
