"""A path given with a leading `~` (quoted, as a script or a config passes it, so no shell expanded it) is the home
directory wherever a path enters: never a directory literally named `~`."""
from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

from grpo_replay.cli import main


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """HOME in the test's folder, the working directory beside it (where a literal `~` would appear)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path / "home"


def test_compare_out_and_report_dir_with_a_tilde(home, capsys):
    # --report-only: the lock, results.json and the report, without training (no runs yet: an empty report)
    assert main(["compare", "--quick", "--out", "~/x", "--report-only"]) == 0
    assert (home / "x/.grpo-replay-compare.lock").exists() and (home / "x/report/report.md").is_file()
    assert main(["compare", "--quick", "--out", "~/x", "--report-dir", "~/r", "--report-only"]) == 0
    assert (home / "r/report.md").is_file()
    assert not Path("~").exists()
    assert main(["compare", "--quick", "--out", "~/x", "--dry-run"]) == 0
    assert f"{home}/x/" in capsys.readouterr().out


@pytest.mark.parametrize("command,argv,dest", [
    ("compare", ["--out", "~/a"], "out"), ("compare", ["--report-dir", "~/a"], "report_dir"),
    ("compare", ["--cache-dir", "~/a"], "cache_dir"), ("compare", ["--data-dir", "~/a"], "data_dir"),
    ("evaluate", ["--model", "m", "--out", "~/a"], "out"), ("evaluate", ["--model", "m", "--baseline", "~/a"], "baseline"),
    ("evaluate", ["--model", "m", "--data-dir", "~/a"], "data_dir"),
    ("plot", ["~/a", "--out", "~/a"], "out"), ("plot", ["~/a"], "run_dirs"),
    ("train", ["--config", "~/a"], "config"),
])
def test_every_path_flag_expands_a_tilde(home, command, argv, dest):
    p = argparse.ArgumentParser()
    importlib.import_module(f"grpo_replay.cli.{command}").add_arguments(p)
    value = getattr(p.parse_args(argv), dest)
    assert str(value[0] if isinstance(value, list) else value) == f"{home}/a"


def test_train_config_file_and_benchmark_dir_with_a_tilde(home, monkeypatch, capsys):
    from grpo_replay.app.data import resolve_benchmark

    (home / "data/benchmarks").mkdir(parents=True)
    (home / "data/benchmarks/aime25.jsonl").write_text("")
    assert resolve_benchmark("aime25", "~/data") == home / "data/benchmarks/aime25.jsonl"
    monkeypatch.setenv("GRPO_REPLAY_DATA", "~/data")
    assert resolve_benchmark("aime25") == home / "data/benchmarks/aime25.jsonl"
    (home / "c.yaml").write_text("steps: 0\n")
    assert main(["train", "--config", "~/c.yaml", "--out", "~/run"]) == 2  # read: its steps=0 is refused
    err = capsys.readouterr().err
    assert "steps" in err and "does not exist" not in err


def test_the_train_preflight_finds_data_given_with_a_tilde(home):
    from grpo_replay.preflight.report import Report
    from grpo_replay.preflight.train_run import check_data
    from grpo_replay.trainer.train_config import resolve

    home.mkdir()
    (home / "d.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    report = Report("grpo-replay train")
    check_data(resolve({"reward": "math", "model": "m", "data": "~/d.jsonl", "heldout_data": "~/d.jsonl"}), report)
    assert not report.refusals and "data: ~/d.jsonl (there)" in report.sections["data"]
