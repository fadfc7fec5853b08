"""Kill -9 a real `grpo-replay train` process at a random step, resume it, and get the uninterrupted run's
metrics exactly (CPU, one torch thread, same seed)."""
import json
import os
import random
import re
import shutil
import signal
import time

import pytest

from helpers import read_jsonl, without_times

from grpo_replay.cli import main
from grpo_replay.trainer import checkpoint, rundir

STEPS = 6  # helpers.TINY


def _same_logs(run, reference):
    got, want = without_times(read_jsonl(run / "metrics.jsonl")), without_times(read_jsonl(reference / "metrics.jsonl"))
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for a, b in zip(got, want):
        assert a == b, f"step {a['step']}: " + str({k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)})
    assert read_jsonl(run / "evals.jsonl") == read_jsonl(reference / "evals.jsonl")
    summary, ref = json.loads((run / "summary.json").read_text()), json.loads((reference / "summary.json").read_text())
    assert summary["heldout_acc_sampled"] == ref["heldout_acc_sampled"]
    assert summary["generated_rollouts"] == ref["generated_rollouts"]


def test_kill_9_at_random_step_then_resume_matches_uninterrupted(reference_run, train_args, run_cli, tmp_path):
    k = random.SystemRandom().randint(2, STEPS - 2)  # printed by pytest on failure
    out = tmp_path / "run"
    args = train_args(out, checkpoint_every=1)
    proc = run_cli(args, tmp_path / "first.log")
    deadline = time.monotonic() + 300
    try:
        while not (out / f"ckpt-{k:06d}" / checkpoint.DONE).is_file():
            assert proc.poll() is None, f"run exited early: {(tmp_path / 'first.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"k={k}"
    killed_at = checkpoint.latest(out)
    assert killed_at is not None and int(killed_at.name[5:]) >= k

    resumed = run_cli(args, tmp_path / "resume.log")  # the same command again
    assert resumed.wait(timeout=300) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    log = (tmp_path / "resume.log").read_text()
    m = re.search(r"resuming .* from ckpt-(\d+) \(step (\d+)", log)
    assert m and int(m.group(2)) >= k, f"k={k}; resume log: {log[-2000:]}"
    _same_logs(out, reference_run)


def test_resume_from_an_eval_step_with_a_torn_metrics_line(reference_run, train_args, tmp_path):
    """Checkpoint at step 3 = an eval step (eval_every=3): its eval row is kept, not duplicated; rows after it,
    and a line cut short by a kill mid-write, are dropped and redone."""
    out = tmp_path / "run"
    assert main(train_args(out, checkpoint_every=1, keep_checkpoints=10)) == 0
    for c in checkpoint.list_checkpoints(out)[3:]:
        shutil.rmtree(c)
    assert checkpoint.latest(out).name == "ckpt-000003"
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "rew')  # torn write
    with open(out / "evals.jsonl", "a") as f:
        f.write('{"step": 9')
    assert main(train_args(out, checkpoint_every=1, keep_checkpoints=10)) == 0
    _same_logs(out, reference_run)


def test_killed_before_the_first_checkpoint_restarts_cleanly(reference_run, train_args, tmp_path):
    """No checkpoint yet but logs exist (killed during step 1-2): the rerun starts over without duplicate rows."""
    out = tmp_path / "run"
    out.mkdir()
    for name in (rundir.MARKER, "config.yaml"):  # what the killed run had written before its first step
        shutil.copy(reference_run / name, out / name)
    ref_metrics = (reference_run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text(ref_metrics[0])
    (out / "evals.jsonl").write_text((reference_run / "evals.jsonl").read_text().splitlines(keepends=True)[0])
    (out / "ckpt-000002.tmp").mkdir()  # a checkpoint write the kill interrupted
    (out / "ckpt-000002.tmp" / "optim.pt").write_bytes(b"partial")
    assert main(train_args(out)) == 0
    _same_logs(out, reference_run)


def test_rerunning_a_finished_run_keeps_its_summary(reference_run, train_args, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference_run, out)
    summary = json.loads((out / "summary.json").read_text())
    assert main(train_args(out)) == 0  # resumes at the last step: nothing to do
    again = json.loads((out / "summary.json").read_text())
    assert again["heldout_acc_sampled"] == summary["heldout_acc_sampled"]
    assert again["final_eval"] == summary["final_eval"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_stops_after_the_step_with_a_checkpoint_then_resume_matches(
        sig, reference_run, train_args, run_cli, tmp_path):
    """No periodic checkpoints (checkpoint_every=0): the signal alone must leave one, at the step it interrupted."""
    out = tmp_path / "run"
    args = train_args(out, checkpoint_every=0)
    log = tmp_path / "first.log"
    proc = run_cli(args, log)
    deadline = time.monotonic() + 300
    try:
        while not (out / "metrics.jsonl").exists() or len(read_jsonl(out / "metrics.jsonl")) < 2:
            assert proc.poll() is None, f"run exited early: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no metrics within 300 s"
            time.sleep(0.02)
        proc.send_signal(sig)
        assert proc.wait(timeout=300) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    m = re.search(rf"stopped: {signal.Signals(sig).name} after step (\d+); checkpoint ckpt-(\d+) written", text)
    assert m, text[-3000:]
    stopped = int(m.group(1))
    assert int(m.group(2)) == stopped and 2 <= stopped < STEPS, text[-3000:]
    assert checkpoint.latest(out).name == f"ckpt-{stopped:06d}"
    assert len(read_jsonl(out / "metrics.jsonl")) == stopped  # the step under way finished and was logged

    resumed = run_cli(args, tmp_path / "resume.log")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    _same_logs(out, reference_run)
