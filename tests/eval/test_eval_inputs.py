"""`grpo-replay eval`: benchmarks with one file name get distinct labels and caches, one evaluation at a time per
--out, the cache notices a model file replaced in place, and bad settings are exit 2 before any generation."""
import json
import os
import shutil
from pathlib import Path

import pytest

from grpo_replay.cli import main
from grpo_replay.generation.transformers import TransformersGenerator
from grpo_replay.eval.harness import EvalSettings, fingerprint
from grpo_replay.trainer import rundir


def _bench(path: Path, answers) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"What is {a}?", "answer": str(a)}) + "\n"
                            for i, a in enumerate(answers)))
    return path


def _argv(model, benchmarks, out, *extra):
    return ["eval", "--model", str(model), "--benchmarks", benchmarks, "--n", "2", "--temperature", "1",
            "--max-new-tokens", "4", "--out", str(out), "--no-progress", "--grade-workers", "0", *extra]


def test_two_benchmark_files_with_one_name_keep_their_own_label_and_cache(tiny_model_dir, tmp_path):
    a = _bench(tmp_path / "a" / "test.jsonl", [1, 2])
    b = _bench(tmp_path / "b" / "test.jsonl", [3, 4, 5])
    out = tmp_path / "out"
    assert main(_argv(tiny_model_dir, f"{a},{b}", out)) == 0
    res = json.loads((out / "results.json").read_text())
    assert {k: v["num_problems"] for k, v in res["benchmarks"].items()} == {"a/test": 2, "b/test": 3}
    assert res["mean"]["num_benchmarks"] == 2
    assert sorted(f.name.split("-")[0] for f in (out / "cache").glob("*.jsonl")) == ["a__test", "b__test"]


def test_benchmark_labels():
    from grpo_replay.eval.harness import benchmark_labels

    assert benchmark_labels(["math500", "x/a/test.jsonl", "y/a/test.jsonl", "z/b.jsonl"]) == [
        "math500", "x/a/test", "y/a/test", "b"]
    with pytest.raises(ValueError, match="'math500' is given twice"):
        benchmark_labels(["math500", "math500"])


def test_an_eval_into_an_out_in_use_is_refused_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch, capsys):
    a = _bench(tmp_path / "a.jsonl", [1])
    out = tmp_path / "out"
    monkeypatch.setattr(TransformersGenerator, "generate", lambda *a, **k: pytest.fail("generated although refused"))
    with rundir.exclusive(out, ".grpo-replay-eval.lock", "grpo-replay eval"):  # another evaluation holds it
        assert main(_argv(tiny_model_dir, str(a), out)) == 2
    err = capsys.readouterr().err
    assert f"{out} is in use by another grpo-replay eval (pid {os.getpid()})" in err
    assert not (out / "results.json").exists()


def test_the_cache_notices_a_model_file_replaced_at_the_same_path(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 60)
    st = model.stat()
    settings = EvalSettings(benchmarks=["math500"])
    before = fingerprint(str(model), "transformers", settings)
    model.write_bytes(b"GGUF" + b"\1" * 60)  # same size, and the time put back as a copy keeping it would
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fingerprint(str(model), "transformers", settings) != before
    # a directory: a file replaced within the same second is noticed too (times in ns, files in subfolders)
    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "w.safetensors").write_bytes(b"a")
    before = fingerprint(str(d), "transformers", settings)
    (d / "sub" / "w.safetensors").write_bytes(b"bb")
    assert fingerprint(str(d), "transformers", settings) != before


def _truncated_copy(tiny_model_dir, dest: Path) -> Path:
    shutil.copytree(tiny_model_dir, dest)
    w = dest / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    return dest


@pytest.mark.parametrize("case, shown", [
    ("dtype", "argument --dtype: invalid choice: 'bogus'"),
    ("device", "--device 'bogus' is invalid; allowed: auto, cpu, cuda, cuda:INDEX"),
    ("config-only", "has a config but its weights cannot be loaded"),
    ("truncated", "has a config but its weights cannot be loaded"),
    ("greedy-n", "n=4 with temperature=0 (greedy decoding, one completion per problem); allowed: n=1"),
    ("out-file", "is a file, not a directory"),
    ("out-under-file", "which is a file"),
])
def test_bad_eval_input_is_exit_2_before_any_generation(case, shown, tiny_model_dir, tmp_path, monkeypatch, capsys):
    bench = _bench(tmp_path / "b.jsonl", [1])
    out, model, extra = tmp_path / "out", tiny_model_dir, []
    if case == "dtype":
        extra = ["--dtype", "bogus"]
    elif case == "device":
        extra = ["--device", "bogus"]
    elif case == "config-only":
        model = tmp_path / "config-only"
        model.mkdir()
        shutil.copy(tiny_model_dir / "config.json", model / "config.json")
    elif case == "truncated":
        model = _truncated_copy(tiny_model_dir, tmp_path / "truncated")
    elif case == "greedy-n":
        extra = ["--n", "4", "--temperature", "0"]
    elif case in ("out-file", "out-under-file"):
        out.write_text("not a directory\n")
        out = out / "results" if case == "out-under-file" else out
        extra = ["--no-cache"]
    argv = _argv(model, str(bench), out)
    if case == "greedy-n":  # the flags replace the defaults of _argv (a flag given twice is refused)
        argv = ["eval", "--model", str(model), "--benchmarks", str(bench), "--max-new-tokens", "4", "--out", str(out),
                "--no-progress"]
    monkeypatch.setattr(TransformersGenerator, "generate", lambda *a, **k: pytest.fail("generated although refused"))
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(argv + extra))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert shown in err and "Traceback" not in err, err
    assert (out.is_file() if case == "out-file" else not out.exists())
