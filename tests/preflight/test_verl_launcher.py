"""The preflight runs a verl launcher as the user would and leaves nothing of it running; where verl is not installed
(this environment), the launch's overrides are read as passed: a list of data files is a list."""
from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

from grpo_replay.cli import main
from grpo_replay.cli.preflight import resolve
from grpo_replay.errors import UsageError
from grpo_replay.preflight.host import Host
from grpo_replay.preflight.verl_launch import captured_overrides, check_verl_overrides

MODEL = ["actor_rollout_ref.model.path=Qwen/Qwen3-4B-Base",
         "actor_rollout_ref.model.enable_gradient_checkpointing=true"]
CPU_HOST = Host(gpus=0, gpu_memory=0, driver=None, torch="2.13.0+cpu", torch_cuda=None, vllm=None)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its parent is not running
        return f.read().split(") ", 1)[1][0] != "Z"


def test_a_launcher_slower_than_the_limit_is_exit_2_and_leaves_nothing_running(tmp_path):
    script = tmp_path / "slow.sh"
    script.write_text(f"sleep 300 &\necho $! > {tmp_path}/bg.pid\nsleep 300\n")
    start = time.monotonic()
    with pytest.raises(UsageError, match=r"slow.sh: did not reach `python -m grpo_replay.integrations.verl.main` "
                                         r"within 2 s \(stopped, with everything it started\); allowed:"):
        captured_overrides(["bash", str(script)], timeout=2)
    assert time.monotonic() - start < 30
    pid = int((tmp_path / "bg.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the launcher's background process is still running"


def test_a_launcher_that_leaves_a_background_process_is_read_and_stopped(tmp_path):
    script = tmp_path / "bg.sh"
    script.write_text(f"sleep 300 &\necho $! > {tmp_path}/bg.pid\npython -m grpo_replay.integrations.verl.main a=1\n")
    assert captured_overrides(["bash", str(script)], timeout=30) == ["a=1"]
    pid = int((tmp_path / "bg.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def test_a_missing_launcher_is_exit_2_naming_it(tmp_path, capsys):
    assert main(["preflight", "bash", str(tmp_path / "nope.sh")]) == 2
    assert "nope.sh did not reach `python -m grpo_replay.integrations.verl.main` (exit 127)" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="reads overrides without verl")
def test_without_verl_a_list_of_train_files_is_a_list_and_a_missing_one_is_named(tmp_path):
    (tmp_path / "a.parquet").touch()
    (tmp_path / "b.parquet").touch()
    ov = [*MODEL, "data.train_batch_size=128", "trainer.n_gpus_per_node=8",
          f"data.train_files=[{tmp_path}/a.parquet,{tmp_path}/b.parquet]", f"data.val_files={tmp_path}/a.parquet",
          "trainer.experiment_name=x", f"trainer.default_local_dir={tmp_path}/x"]
    report = check_verl_overrides(ov, CPU_HOST, None, "verl")
    assert not report.refusals, report.render()
    assert f"data.train_files: {tmp_path}/b.parquet (there)" in report.render()
    ov[4] = f"data.train_files=[{tmp_path}/a.parquet,'{tmp_path}/c.parquet']"
    refused = check_verl_overrides(ov, CPU_HOST, None, "verl").refusals
    assert [(r.field, r.problem) for r in refused] == [("data.train_files", f"{tmp_path}/c.parquet does not exist")]


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="reads overrides without verl")
def test_without_verl_a_folder_with_checkpoints_is_not_said_to_resume(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "latest_checkpointed_iteration.txt").write_text("20")
    ov = [*MODEL, "data.train_batch_size=128", "trainer.experiment_name=x",
          f"trainer.default_local_dir={tmp_path}/x"]
    text = check_verl_overrides(ov, CPU_HOST, None, "verl").render()
    assert "holds global_step_20; the entry point resumes it if its record" in text and "RESUMES" not in text
    assert "the entry point's checks (verl's validate_config, lengths, the run-folder record) are not run" in text


VERL_PYTHON = Path(__file__).resolve().parents[2] / ".venv-verl" / "bin" / "python"


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None or not VERL_PYTHON.is_file(),
                    reason="needs this environment without verl and the verl environment beside it")
def test_without_verl_here_the_launchs_own_python_runs_the_entry_points_checks(tmp_path, monkeypatch):
    """A launch whose PATH puts the verl environment first (as docs/verl.md runs the launchers) is checked there."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    (tmp_path / "train.parquet").touch()
    (tmp_path / "test.parquet").touch()
    launch = [f"PATH={VERL_PYTHON.parent}:{os.environ['PATH']}", "MODEL=Qwen/Qwen3-4B-Base", f"DATA={tmp_path}",
              f"CKPT_ROOT={tmp_path}/ckpt", "bash", "examples/verl/run_paper_single_node.sh",
              "actor_rollout_ref.rollout.max_model_len=4096"]
    report = resolve(launch, CPU_HOST, None)
    text = report.render()
    assert f"checked by the launch's own python, {VERL_PYTHON}" in text, text
    assert [r.field for r in report.refusals] == ["actor_rollout_ref.rollout.max_model_len"], text
    assert "replay age bound: replay.tau_max=10" in text and not (tmp_path / "ckpt").exists()
