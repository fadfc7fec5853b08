"""`grpo-replay eval` end to end on CPU with a tiny random model, plus the file-free runner API with a scripted
generator (so accuracy is non-zero and the metric arithmetic is checked against known answers)."""
import json

import pytest

from grpo_replay.cli import main
from grpo_replay.app.data import load_problems
from grpo_replay.eval import pass_at_k
from grpo_replay.eval.prompts import build_prompt
from grpo_replay.generation import Completion, SamplingParams
from grpo_replay.generation.transformers import TransformersGenerator
from grpo_replay.eval.harness import EvalSettings, run_evaluation

from grpo_replay.app.data import BENCHMARKS

N, KS = 4, [1, 2, 4]


def eval_args(model_dir, bench_dir, out, *extra):
    """The command line; `extra` (flag, value pairs) replaces the default of a flag (a flag given twice is refused)."""
    defaults = {"--benchmarks": ",".join(BENCHMARKS), "--data-dir": str(bench_dir), "--limit": "2", "--n": str(N),
                "--k": ",".join(map(str, KS)), "--max-new-tokens": "8", "--temperature": "1.0", "--out": str(out)}
    given = set(extra[::2])
    return ["eval", "--model", str(model_dir), *[x for k, v in defaults.items() if k not in given for x in (k, v)],
            "--no-progress", *extra]


def check_consistent(res):
    """Every reported number follows from the per-problem counts."""
    for name in BENCHMARKS:
        row = res["benchmarks"][name]
        probs = row["problems"]
        assert row["num_problems"] == 2 and all(p["n"] == N for p in probs)
        assert row["mean@n"] == pytest.approx(sum(p["c"] / p["n"] for p in probs) / len(probs))
        for k in KS:
            expected = sum(pass_at_k(p["n"], p["c"], k) for p in probs) / len(probs)
            assert row["pass@k"][str(k)] == pytest.approx(expected)
        assert row["num_samples"] == 2 * N and row["num_correct"] == sum(p["c"] for p in probs)
        assert row["length"]["all"] == pytest.approx(sum(p["mean_length"] for p in probs) / len(probs))
        assert 1 <= row["length"]["all"] <= 8
    mean = res["mean"]
    assert mean["mean@n"] == pytest.approx(sum(res["benchmarks"][b]["mean@n"] for b in BENCHMARKS) / 5)
    for k in KS:
        assert mean["pass@k"][str(k)] == pytest.approx(sum(res["benchmarks"][b]["pass@k"][str(k)] for b in BENCHMARKS) / 5)


def test_cli_end_to_end_with_cache_resume_and_baseline(tiny_model_dir, bench_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(eval_args(tiny_model_dir, bench_dir, out)) == 0
    for name in ("results.json", "results.md", "pass_at_k.png", "length_split.png"):
        assert (out / name).stat().st_size > 0, name
    res = json.loads((out / "results.json").read_text())
    check_consistent(res)
    assert all(res["benchmarks"][b]["cache"] == {"from_cache": 0, "generated": 2} for b in BENCHMARKS)
    cache_files = sorted((out / "cache").glob("*.jsonl"))
    assert len(cache_files) == 5 and all(len(f.read_text().splitlines()) == 2 for f in cache_files)
    table = (out / "results.md").read_text()
    assert "| math500 | 2 |" in table and "**mean**" in table and "pass@4" in table

    # Second run: nothing is regenerated (generation would fail), and the numbers are identical.
    def no_generate(*args, **kwargs):
        raise AssertionError("generate called although every problem is cached")

    monkeypatch.setattr(TransformersGenerator, "generate", no_generate)
    assert main(eval_args(tiny_model_dir, bench_dir, out)) == 0
    res2 = json.loads((out / "results.json").read_text())
    assert all(res2["benchmarks"][b]["cache"] == {"from_cache": 2, "generated": 0} for b in BENCHMARKS)
    assert res2["mean"] == res["mean"]

    # Baseline comparison: a synthetic baseline with known accuracy and twice the length.
    base = json.loads(json.dumps(res))
    for row in list(base["benchmarks"].values()) + [base["mean"]]:
        row["mean@n"] = 0.5
        row["length"] = {part: (2 * v if v else v) for part, v in row["length"].items()}
    base_path = tmp_path / "baseline.json"
    base_path.write_text(json.dumps(base))
    assert main(eval_args(tiny_model_dir, bench_dir, out, "--baseline", str(base_path))) == 0
    res3 = json.loads((out / "results.json").read_text())
    for row in list(res3["benchmarks"].values()) + [res3["mean"]]:
        vs = row["vs_baseline"]
        assert vs["length_change"]["all"] == pytest.approx(-0.5)
        d_acc = (row["mean@n"] - 0.5) / 0.5
        expected = 0.5 + (3 * abs(d_acc) if d_acc >= 0 else -5 * abs(d_acc))
        assert vs["aes"] == pytest.approx(expected)
    assert "AES" in (out / "results.md").read_text()


def test_the_cache_is_keyed_by_dtype_and_batch_size_and_results_record_them(tiny_model_dir, bench_dir, tmp_path):
    """A bfloat16 evaluation after a float32 one into the same --out generates anew (the two sample different texts
    under one seed), as does another batch size (a batch draws from one seed); results.json says which ran."""
    out = tmp_path / "run"
    one = ("--benchmarks", "math500")
    assert main(eval_args(tiny_model_dir, bench_dir, out, *one, "--dtype", "float32")) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["engine"] == {"dtype": "float32", "device": "cpu"} and res["settings"]["batch_size"] == 8
    assert main(eval_args(tiny_model_dir, bench_dir, out, *one, "--dtype", "bfloat16")) == 0
    res2 = json.loads((out / "results.json").read_text())
    assert res2["benchmarks"]["math500"]["cache"] == {"from_cache": 0, "generated": 2}
    assert res2["engine"]["dtype"] == "bfloat16" and res2["fingerprint"] != res["fingerprint"]
    assert main(eval_args(tiny_model_dir, bench_dir, out, *one, "--dtype", "float32", "--batch-size", "1")) == 0
    res3 = json.loads((out / "results.json").read_text())
    assert res3["benchmarks"]["math500"]["cache"] == {"from_cache": 0, "generated": 2}
    assert main(eval_args(tiny_model_dir, bench_dir, out, *one, "--dtype", "float32")) == 0  # the first one's cache
    assert json.loads((out / "results.json").read_text())["benchmarks"]["math500"]["cache"] == {"from_cache": 2, "generated": 0}


def test_a_file_not_found_mid_generation_is_not_reported_as_bad_input(tiny_model_dir, bench_dir, tmp_path, monkeypatch):
    def lost(*_a, **_k):
        raise FileNotFoundError("a file the evaluation itself needs is gone")

    monkeypatch.setattr(TransformersGenerator, "generate", lost)
    with pytest.raises(FileNotFoundError, match="is gone"):
        main(eval_args(tiny_model_dir, bench_dir, tmp_path / "run", "--benchmarks", "math500"))


def test_cli_errors(tiny_model_dir, bench_dir, tmp_path, capsys):
    assert main(eval_args(tmp_path / "missing-model", bench_dir, tmp_path / "o")) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(eval_args(tiny_model_dir, bench_dir, tmp_path / "o", "--k", "1,8")) == 2
    assert "1 <= k <= n=4" in capsys.readouterr().err
    assert main(eval_args(tiny_model_dir, bench_dir, tmp_path / "o", "--benchmarks", "nope")) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err
    not_lm = tmp_path / "t5"
    not_lm.mkdir()
    (not_lm / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 8, "num_layers": 1}))
    assert main(eval_args(not_lm, bench_dir, tmp_path / "o")) == 2
    assert "not a causal LM" in capsys.readouterr().err


def test_prompt_template_options(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert build_prompt("1+1?", tok) == "<|user|>1+1?\nPlease reason step by step, and put your final answer within \\boxed{}.\n<|assistant|>"
    assert build_prompt("1+1?", tok, instruction="Box it.", use_chat_template=False) == "1+1?\nBox it."
    assert build_prompt("1+1?", None, instruction="Q: {problem} A:") == "Q: 1+1? A:"


class ScriptedGenerator:
    """Answers problem i correctly in the first (i mod (n+1)) of its n samples; lengths 10 (right) / 30 (wrong)."""

    def __init__(self, answers_by_prompt):
        self.answers, self.calls = answers_by_prompt, 0

    def generate(self, prompts, params, seed):
        self.calls += 1
        groups = []
        for prompt in prompts:
            answer, i = self.answers[prompt]
            right = i % (params.n + 1)
            groups.append([Completion(f"so \\boxed{{{answer}}}", 10) if s < right else Completion("\\boxed{nope}", 30)
                           for s in range(params.n)])
        return groups


def test_runner_api_metric_arithmetic(bench_dir, tmp_path):
    settings = EvalSettings(benchmarks=["aime25", "math500"], ks=KS, sampling=SamplingParams(n=N), data_dir=str(bench_dir),
                            use_chat_template=False, grade_workers=0, progress=False)
    answers = {}
    for name in settings.benchmarks:
        for i, p in enumerate(load_problems(bench_dir / f"{name}.jsonl", split="test")):
            answers[build_prompt(p.problem, None, settings.instruction, False)] = (p.answer, i)
    gen = ScriptedGenerator(answers)
    res = run_evaluation(gen, settings, cache_dir=tmp_path / "cache")
    row = res["benchmarks"]["aime25"]
    assert [p["c"] for p in row["problems"]] == [0, 1, 2]
    assert row["mean@n"] == pytest.approx((0 + 0.25 + 0.5) / 3)
    assert row["pass@k"]["2"] == pytest.approx((0 + pass_at_k(4, 1, 2) + pass_at_k(4, 2, 2)) / 3)
    assert row["length"]["correct"] == 10 and row["length"]["incorrect"] == 30
    assert row["length"]["all"] == pytest.approx((3 * 10 + 9 * 30) / 12)
    calls = gen.calls
    run_evaluation(gen, settings, cache_dir=tmp_path / "cache")
    assert gen.calls == calls  # fully cached
