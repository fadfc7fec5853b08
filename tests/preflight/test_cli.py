"""The command line of `grpo-replay preflight`: its forms, exit codes, and that it writes nothing."""
from grpo_replay.cli import main


def test_a_cpu_testbed_launch_passes_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["preflight", "grpo-replay", "train", "--steps", "2", "--set", "prompts_per_step=2"]) == 0
    out = capsys.readouterr().out
    assert "runs/paper-seed0: new run" in out and "OK: nothing found" in out
    assert list(tmp_path.iterdir()) == []


def test_bad_input_exits_2_naming_what_is_allowed(capsys):
    assert main(["preflight"]) == 2
    assert "needs the launch to check after it; allowed: grpo-replay train" in capsys.readouterr().err
    assert main(["preflight", "make", "train"]) == 2
    assert "'make train' is not a launch it knows" in capsys.readouterr().err
    for value in ("-1", "0", "inf", "nan", "1e-6", "80GB"):
        assert main(["preflight", "--gpu-memory", value, "train"]) == 2
        assert f"--gpu-memory={value} is invalid; allowed: GiB per GPU, a number from 1 to 1024" in \
            capsys.readouterr().err


def test_a_setting_the_command_refuses_is_reported_with_its_field(capsys):
    assert main(["preflight", "train", "--set", "group_size=1"]) == 2
    out = capsys.readouterr().out
    assert "group_size: TrainConfig.group_size=1 is invalid; fix: an integer >= 2" in out
