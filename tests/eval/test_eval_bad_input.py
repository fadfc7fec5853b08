"""`grpo-replay eval` refuses a benchmark without problems (a table of 0 problems would read as a result)."""
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
