"""`grpo-replay eval` refuses a benchmark without problems (a table of 0 problems would read as a result) and bad
sampling or grading settings, before any model loads."""
import pytest

from grpo_replay.cli import main


def test_empty_benchmark_file_is_an_error(tiny_model_dir, tmp_path, capsys):
    bench = tmp_path / "empty.jsonl"
    for content in ("", "\n\n"):
        bench.write_text(content)
        out = tmp_path / "out"
        argv = ["eval", "--model", str(tiny_model_dir), "--benchmarks", str(bench), "--n", "2", "--out", str(out),
                "--no-progress"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"grpo-replay eval: error: benchmark '{bench}' ({bench}) has no problems" in err, err
        assert not out.exists()


@pytest.mark.parametrize("flags, shown", [
    (["--temperature", "nan"], "temperature must be a finite number >= 0, got nan"),
    (["--temperature", "inf"], "temperature must be a finite number >= 0, got inf"),
    (["--temperature", "-0.5"], "temperature must be a finite number >= 0, got -0.5"),
    (["--top-p", "nan"], "top_p must be in (0, 1], got nan"),
    (["--grade-timeout", "0"], "grade_timeout must be a finite number of seconds > 0, got 0.0"),
    (["--grade-timeout", "nan"], "grade_timeout must be a finite number of seconds > 0, got nan"),
    (["--grade-workers", "-1"], "grade_workers must be >= 0 (0 grades in this process; unset: by batch size), got -1"),
    (["--aes-weights", "1", "nan", "5"], "aes_weights (alpha, beta, gamma) must be three finite numbers >= 0, got (1.0, nan, 5.0)"),
    (["--n", "1e1", "--k", "16"], "k values [16] are invalid: each k must satisfy 1 <= k <= n=10"),
    (["--n", "4", "--k", "1,1,2,4,2"], "k values [1, 2] are given twice in [1, 1, 2, 4, 2]; give each k once"),
    (["--seed", "-5"], "--seed -5 is invalid; allowed: an integer in 0..2147483647"),
    (["--backend", "vllm", "--dtype", "float32"], "--dtype float32 is for --backend transformers; allowed with --backend vllm: auto"),
    (["--backend", "vllm", "--device", "cpu"], "--device cpu is for --backend transformers; allowed with --backend vllm: auto"),
])
def test_bad_sampling_and_grading_settings_fail_before_the_model_loads(flags, shown, tmp_path, capsys):
    """A model path that does not exist: the settings' error must come first (nothing loaded, nothing written)."""
    out = tmp_path / "out"
    argv = ["eval", "--model", str(tmp_path / "no-such-model"), "--benchmarks", "math500", "--out", str(out),
            "--no-progress", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"grpo-replay eval: error: {shown}" in err, err
    assert not out.exists()
