"""The run directory: float keys in any notation, resume only with the run's own config, one run at a time
(lock), no writing into unusable or foreign directories, a separate default directory for --backend trl, and
re-running a saved config into a new directory."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import read_jsonl, without_times

from grpo_replay.errors import ConfigError
from grpo_replay.cli import main
from grpo_replay.cli import train as command
from grpo_replay.cli.compare import COMPARE_LOCK
from grpo_replay.trainer import rundir
from grpo_replay.trainer.train_config import TrainConfig


def _snapshot(d: Path) -> dict:
    """Every file under d with its bytes: a refused command must leave it exactly as it was."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _copy_run(reference_run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(reference_run, out)
    return out


def _cli_config(*argv: str) -> TrainConfig:
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    return command.config_from_args(p.parse_args(list(argv)))


# --- config parsing: every ordinary number ------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [("1e-6", 1e-6), ("1E-6", 1e-6), ("2.5e-4", 2.5e-4), (".5", 0.5), ("1000", 1000.0)])
def test_float_keys_take_exponent_notation_on_the_command_line(text, value):
    cfg = _cli_config("--set", f"lr={text}", "--set", f"replay.replay_ratio={text}", "--set", f"loss.eps_high={text}")
    assert (cfg.lr, cfg.replay.replay_ratio, cfg.loss.eps_high) == (value, value, value)
    assert _cli_config("--set", "replay.replay_ratio=1e6").replay.replay_ratio == 1e6


def test_float_keys_take_exponent_notation_in_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 1e-6\nreplay:\n  replay_ratio: 1e6\n  eps: 1E-8\nloss:\n  eps_high: .3\n")
    cfg = _cli_config("--config", str(path))
    assert (cfg.lr, cfg.replay.replay_ratio, cfg.replay.eps, cfg.loss.eps_high) == (1e-6, 1e6, 1e-8, 0.3)
    # the resolved config.yaml reads back the same
    again = tmp_path / "again.yaml"
    again.write_text(cfg.to_yaml())
    assert _cli_config("--config", str(again)) == cfg


@pytest.mark.parametrize("text", ["1e", "e5", "1.2.3", "1e-6x", "inf"])
def test_float_keys_reject_text_that_is_not_a_number(text):
    with pytest.raises(ConfigError, match=f"lr='{text}' has the wrong type; expected float"):
        _cli_config("--set", f"lr={text}")


@pytest.mark.parametrize("text", ["1000", "1_000", "1e3", "1E3", "1000.0", "1.0e3", "+1e3"])
def test_integer_keys_take_a_whole_number_in_any_notation(text):
    cfg = _cli_config("--steps", text, "--set", f"replay.capacity={text}", "--set", f"eval_problems={text}")
    assert (cfg.steps, cfg.replay.capacity, cfg.eval_problems) == (1000, 1000, 1000)
    assert all(type(v) is int for v in (cfg.steps, cfg.replay.capacity, cfg.eval_problems))


def test_a_long_integer_in_exponent_notation_is_not_rounded_through_float():
    assert command.configio.integral("12345678901234567") == 12345678901234567
    assert command.configio.integral("1.2345678901234567e16") == 12345678901234567  # float() would round it


def test_an_absurd_exponent_is_refused_at_once_not_built():
    t0 = time.perf_counter()
    assert command.configio.integral("1e999999999") is None  # int(Decimal(...)) of it would run for minutes
    assert command.configio.integral("1e18") == 10**18 and command.configio.integral("1e19") is None
    assert time.perf_counter() - t0 < 1


def test_a_directory_lock_message_survives_braces_in_the_path(tmp_path):
    d = tmp_path / "out{x}"
    with rundir.exclusive(d, ".l", "grpo-replay compare"):
        with pytest.raises(rundir.RunDirError, match=r"out\{x\} is in use by another grpo-replay compare \(pid "):
            with rundir.exclusive(d, ".l", "grpo-replay compare"):
                pass


@pytest.mark.parametrize("text", ["1.5", "1e-3", "inf", "nan", "ten", "true"])
def test_integer_keys_reject_what_is_not_a_whole_number(text, capsys):
    with pytest.raises(ConfigError, match="has the wrong type; expected int"):
        _cli_config("--set", f"steps={text}")
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--steps", text])
    assert f"argument --steps: invalid integer '{text}' (write a whole number: 1000, 1_000 or 1e3)" in capsys.readouterr().err


@pytest.mark.parametrize("argv, shown", [
    (["--steps", "10", "--set", "steps=1000"], "steps is given twice on the command line (--steps 10 and --set steps=1000)"),
    (["--set", "lr=1e-3", "--set", "lr=2e-3"], "lr is given twice on the command line (--set lr=1e-3 and --set lr=2e-3)"),
    (["--out", "a", "--set", "out_dir=b"], "out_dir is given twice on the command line (--out a and --set out_dir=b)"),
])
def test_a_key_given_twice_on_the_command_line_is_refused_not_last_wins(argv, shown, tmp_path, capsys):
    with pytest.raises(ConfigError, match=shown.replace("(", r"\(").replace(")", r"\)")):
        _cli_config(*argv)
    # and through the commands: nothing computed
    assert main(["train", "--steps", "3", "--set", "steps=4", "--out", str(tmp_path / "run")]) == 2
    assert "steps is given twice" in capsys.readouterr().err and not (tmp_path / "run").exists()
    assert main(["compare", "--testbed", "small", "--set", "testbed_preset=large", "--out", str(tmp_path / "c"),
                 "--dry-run"]) == 2
    assert ("testbed_preset is given twice on the command line (--testbed small and --set testbed_preset=large)"
            in capsys.readouterr().err) and not (tmp_path / "c").exists()
    assert main(["compare", "--set", "lr=1e-3", "--set", "lr=1e-3", "--out", str(tmp_path / "c"), "--dry-run"]) == 2
    assert "lr is given twice" in capsys.readouterr().err
    assert main(["compare", "--backend", "trl", "--set", "backend=builtin", "--out", str(tmp_path / "c"), "--dry-run"]) == 2
    assert "backend is given twice on the command line (--backend trl and --set backend=builtin)" in capsys.readouterr().err


def test_compare_takes_integer_keys_in_any_notation(tmp_path, capsys):
    """The arms and the plan read steps and prompts_per_step before any run resolves its config."""
    argv = ["compare", "--arms", "paper", "--seeds", "1", "--out", str(tmp_path / "c"), "--dry-run"]
    assert main([*argv, "--set", "steps=1e3", "--set", "prompts_per_step=3.2e1"]) == 0
    a = capsys.readouterr().out
    assert main([*argv, "--set", "steps=1000", "--set", "prompts_per_step=32"]) == 0
    assert capsys.readouterr().out == a  # the same runs (same config hashes)


def test_nonfinite_lr_is_rejected_naming_the_key(tmp_path, capsys):
    for text, shown in ((".nan", "nan"), (".inf", "inf"), ("-.inf", "-inf")):
        assert main(["train", "--set", f"lr={text}", "--out", str(tmp_path / "run")]) == 2
        assert f"TrainConfig.lr={shown} is invalid; allowed: a finite number > 0" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# --- resume with a changed config ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, key",
    [({"group_size": 8}, "group_size"), ({"lr": 1e-3}, "lr"), ({"replay.tau_max": 3}, "replay.tau_max"),
     ({"preset": "grpo"}, "preset"), ({"backend": "trl"}, "backend")],
)
def test_resume_with_a_changed_config_is_refused_and_changes_nothing(reference_run, train_args, tmp_path, capsys, extra, key):
    out = _copy_run(reference_run, tmp_path)
    before = _snapshot(out)
    assert main(train_args(out, **extra)) == 2
    err = capsys.readouterr().err
    assert "holds a run made with a different config" in err and f"  {key}: " in err and "(requested)" in err, err
    assert "--out NEWDIR" in err and "Traceback" not in err
    assert _snapshot(out) == before  # config.yaml, logs and checkpoints untouched


def test_resume_may_change_the_documented_keys(reference_run, train_args, tmp_path, capsys):
    out = _copy_run(reference_run, tmp_path)
    metrics = (out / "metrics.jsonl").read_bytes()
    assert main(train_args(out, eval_every=2, checkpoint_every=3, keep_checkpoints=5)) == 0
    assert "has already done its 6 steps; nothing to train" in capsys.readouterr().err
    assert "eval_every: 2" in (out / "config.yaml").read_text()  # the run's config is the one it now runs with
    assert (out / "metrics.jsonl").read_bytes() == metrics


def test_resume_with_fewer_steps_than_done_is_refused(reference_run, train_args, tmp_path, capsys):
    out = _copy_run(reference_run, tmp_path)
    before = _snapshot(out)
    assert main(train_args(out, steps=4)) == 2
    assert "TrainConfig.steps=4 is below the 6 steps the run" in capsys.readouterr().err
    assert _snapshot(out) == before


# --- one run per directory -----------------------------------------------------------------------------------
def _race(run_cli, args: list[str], tmp_path, lock: Path) -> tuple[int, str]:
    """Two real processes of the same command on one directory; exactly one must succeed and the other exit 2.
    Returns (the winner's pid, the loser's log).

    The first is frozen (SIGSTOP) the moment it holds `lock` and thawed once the second has exited. Started merely
    together, one tiny run could finish before the other had imported torch, and then both exited 0 (a flake on
    the loaded 2-core machine); frozen, it holds the lock for as long as the second needs to reach it."""
    first = run_cli(args, tmp_path / "0.log")
    deadline = time.monotonic() + 300
    try:
        while not _holds(lock, first.pid):
            assert first.poll() is None, (tmp_path / "0.log").read_text()
            assert time.monotonic() < deadline, "the first process never took the lock"
            time.sleep(0.01)
        os.kill(first.pid, signal.SIGSTOP)
        second = run_cli(args, tmp_path / "1.log")
        codes = [None, second.wait(timeout=300)]
    finally:
        os.kill(first.pid, signal.SIGCONT)
    codes[0] = first.wait(timeout=300)
    logs = [(tmp_path / f"{i}.log").read_text() for i in range(2)]
    assert codes == [0, 2], logs
    assert "Traceback" not in logs[1], logs[1]
    return first.pid, logs[1]


def _holds(lock: Path, pid: int) -> bool:
    try:
        return json.loads(lock.read_text()).get("pid") == pid
    except (OSError, ValueError):
        return False


def test_two_trainings_into_one_directory_at_once_exactly_one_runs(reference_run, train_args, run_cli, tmp_path):
    out = tmp_path / "run"
    pid, lost = _race(run_cli, train_args(out, steps=3), tmp_path, out / rundir.LOCK)
    assert f"is in use by another grpo-replay run (pid {pid})" in lost, lost
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]  # one run's steps, in order
    assert [r["step"] for r in read_jsonl(out / "evals.jsonl")] == [0, 3]


TINY_COMPARE = ["--arms", "paper", "--seeds", "1", "--jobs", "1", "--no-progress",
                "--set", "steps=2", "--set", "prompts_per_step=4", "--set", "group_size=4", "--set", "eval_every=2",
                "--set", "eval_problems=8", "--set", "eval_samples=2", "--set", "checkpoint_every=0",
                "--set", "testbed.num_layers=1", "--set", "testbed.warmstart_max_steps=4",
                "--set", "testbed.warmstart_min_steps=0", "--set", "testbed.warmstart_eval_every=2",
                "--set", "testbed.warmstart_eval_problems=8"]


def test_two_compares_into_one_out_at_once_the_second_is_refused(run_cli, tmp_path):
    """Two real `grpo-replay compare` processes started together on one --out: one runs, the other exits 2 naming
    the holder, before it trains or writes anything (they would race for the same runs and reports)."""
    out = tmp_path / "cmp"
    args = ["compare", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), *TINY_COMPARE]
    pid, lost = _race(run_cli, args, tmp_path, out / COMPARE_LOCK)
    assert f"{out} is in use by another grpo-replay compare (pid {pid})" in lost, lost
    assert "done " not in lost
    res = json.loads((out / "report" / "results.json").read_text())
    assert res["run_info"]["ran"] == 2 and res["missing_runs"] == []
    # the winner is gone, so its lock is free: the same command now reuses both runs
    assert main(args) == 0
    assert json.loads((out / "report" / "results.json").read_text())["run_info"]["skipped"] == 2


def test_a_stale_lock_of_a_dead_process_is_taken_over(reference_run, train_args, tmp_path):
    out = _copy_run(reference_run, tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / rundir.LOCK).write_text(json.dumps({"pid": dead.pid, "since": time.time()}))
    assert main(train_args(out)) == 0
    assert json.loads((out / rundir.LOCK).read_text())["pid"] == os.getpid()


# --- unusable or foreign directories ------------------------------------------------------------------------
def test_empty_out_is_refused_and_the_current_directory_untouched(train_args, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("mine: true\n")
    (tmp_path / "summary.json").write_text("{}")
    before = _snapshot(tmp_path)
    assert main(train_args("")) == 2
    assert "empty value for out_dir" in capsys.readouterr().err  # refused while parsing, before any run-directory check
    assert _snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "summary.json"]


def test_out_dir_that_is_a_file_or_under_a_file(train_args, tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(train_args(f)) == 2
    assert f"TrainConfig.out_dir='{f}' is a file, not a directory" in capsys.readouterr().err
    assert main(train_args(f / "run")) == 2
    err = capsys.readouterr().err
    assert f"lies under '{f}', which is a file" in err and "Traceback" not in err
    assert f.read_text() == "x"


def test_out_dir_that_is_not_writable(train_args, tmp_path, capsys):
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "run"
    else:  # root may write anywhere a mode allows: /sys refuses even root
        target = Path("/sys/grpo-replay-test-run")
        if not Path("/sys").is_dir():
            pytest.skip("no read-only directory to try as root")
    assert main(train_args(target)) == 2
    err = capsys.readouterr().err
    assert f"TrainConfig.out_dir='{target}' is not writable" in err and "Traceback" not in err
    assert not target.exists()


def test_a_directory_with_files_grpo_replay_did_not_make_is_refused(train_args, tmp_path, capsys):
    out = tmp_path / "project"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "config.yaml").write_text("not: ours\n")
    before = _snapshot(out)
    assert main(train_args(out)) == 2
    assert "holds files grpo-replay did not make (config.yaml, notes.txt)" in capsys.readouterr().err
    assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == ["config.yaml", "notes.txt"]


def test_a_run_made_before_the_marker_is_adopted(reference_run, train_args, tmp_path):
    out = _copy_run(reference_run, tmp_path)
    (out / rundir.MARKER).unlink()
    (out / rundir.LOCK).unlink()
    assert main(train_args(out)) == 0
    assert (out / rundir.MARKER).is_file()


# --- backends -----------------------------------------------------------------------------------------------
def test_trl_backend_has_its_own_default_run_directory():
    assert TrainConfig().run_dir == Path("runs/paper-seed0")
    assert TrainConfig(backend="trl").run_dir == Path("runs/trl-paper-seed0")
    assert TrainConfig(backend="trl", preset="grpo", seed=3).run_dir == Path("runs/trl-grpo-seed3")
    assert TrainConfig(backend="trl", out_dir="x/{seed}").run_dir == Path("x/0")  # an explicit out_dir is kept


# --- re-running a saved config ------------------------------------------------------------------------------
def test_rerunning_a_saved_config_into_a_new_directory(reference_run, tmp_path, capsys):
    out = _copy_run(reference_run, tmp_path)
    saved = out / "config.yaml"
    metrics = (out / "metrics.jsonl").read_bytes()
    # Into its own directory: the finished run is resumed, nothing trained, and the message says how to re-run.
    assert main(["train", "--config", str(saved), "--out", str(out), "--no-progress"]) == 0
    assert f"--config {saved} --out NEWDIR" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_bytes() == metrics
    new = tmp_path / "rerun"
    assert main(["train", "--config", str(saved), "--out", str(new), "--no-progress"]) == 0
    assert without_times(read_jsonl(new / "metrics.jsonl")) == without_times(read_jsonl(reference_run / "metrics.jsonl"))
    assert read_jsonl(new / "evals.jsonl") == read_jsonl(reference_run / "evals.jsonl")
