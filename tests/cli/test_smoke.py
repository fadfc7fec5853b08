"""The command line end to end, as fast as it goes (part of the quick tier, `bash scripts/test.sh --quick`): every
command parses its arguments, `train` trains a tiny testbed run and writes its records, bad input exits 2 naming
the field before anything is written, and `preflight` checks a launch. The full behaviour of each command is
tested under tests/trainer, tests/preflight, tests/experiments and tests/reliability.
"""
import json

import pytest

from grpo_replay.cli import COMMANDS, main
from helpers import read_jsonl


def _train(overrides: dict, out, **extra) -> list[str]:
    argv = ["train", "--out", str(out), "--no-progress"]
    for k, v in {**overrides, **extra}.items():
        if k != "progress":
            argv += ["--set", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    return argv


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_builds_its_arguments(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert f"grpo-replay {command}" in capsys.readouterr().out


def test_train_runs_a_tiny_testbed_run_and_writes_its_records(tiny_overrides, tmp_path):
    out = tmp_path / "run"
    assert main(_train(tiny_overrides, out, steps=2, eval_every=2, checkpoint_every=2,
                       **{"replay.warmup_steps": 1})) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["replay/count"] > 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    assert (out / "ckpt-000002" / "buffer.npz").is_file()


def test_bad_input_exits_2_naming_the_field_before_anything_is_written(tiny_overrides, tmp_path, capsys):
    out = tmp_path / "bad"
    assert main(_train(tiny_overrides, out, **{"replay.tau_maxx": 3})) == 2
    assert "did you mean 'replay.tau_max'" in capsys.readouterr().err
    assert not out.exists()


def test_preflight_passes_a_testbed_launch_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["preflight", "grpo-replay", "train", "--steps", "2", "--set", "prompts_per_step=2"]) == 0
    assert "OK: nothing found" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
