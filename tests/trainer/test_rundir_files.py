"""`RunDir`, the one owner of a run directory's files, and `TrainConfig.flat()`, the form two configs compare in."""
import json

import yaml

from grpo_replay.app import configio
from grpo_replay.trainer import checkpoint
from grpo_replay.trainer.rundir import RunDir, claim, config_diff
from grpo_replay.trainer.train_config import resolve


def test_flat_is_the_config_yaml_read_back():
    for overrides in ({}, {"testbed_preset": "reasoning", "replay.tau_max": 5, "loss.eps_high": 0.3},
                      {"preset": "grpo", "report_to": ["tensorboard"], "testbed.working_prob": [0.3, 0.1, 0.1, 0.2, 0.2]}):
        cfg = resolve(overrides)
        assert cfg.flat() == configio.flatten(yaml.safe_load(cfg.to_yaml()))
        assert resolve(yaml_path=None, overrides=cfg.flat()).flat() == cfg.flat()


def test_config_diff_names_only_the_keys_that_change_what_a_step_computes():
    a, b = resolve({"seed": 1}), resolve({"seed": 1, "steps": 9, "replay.tau_max": 3})
    assert config_diff(a, b) == {"replay.tau_max": (a.replay.tau_max, 3)}


class _Tracker:
    def __init__(self):
        self.rows = []

    def log(self, row):
        self.rows.append(row)


def test_claim_yields_the_run_dir_that_writes_its_logs_and_summary(tmp_path, tiny_overrides):
    cfg = resolve({**tiny_overrides, "out_dir": str(tmp_path / "run")})
    tracker = _Tracker()
    with claim(cfg) as run:
        assert isinstance(run, RunDir) and run == cfg.run_dir and run / "config.yaml" == cfg.run_dir / "config.yaml"
        run.log_eval({"step": 0, "acc": 0.5}, tracker)
        for s in (1, 2, 3):
            run.log_metrics({"step": s, "reward": s / 10}, tracker)
        run.log_eval({"step": 2, "acc": 0.75}, tracker)
        assert [r["step"] for r in tracker.rows] == [0, 1, 2, 3, 2]
        run.keep_logs_to(2)  # a resume from ckpt-000002: step 3 is redone
        assert run.read_metrics() == [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.2}]
        assert run.read_evals() == [{"step": 0, "acc": 0.5}, {"step": 2, "acc": 0.75}]
        assert run.read_summary() is None and run.latest_checkpoint() is None
        written = run.write_summary({"steps": 2})
        assert json.loads((tmp_path / "run" / "summary.json").read_text()) == written == run.read_summary()
        assert "provenance" in written


def _complete_checkpoint(run_dir, step, config_yaml=None):
    ckpt = run_dir / f"ckpt-{step:06d}"
    ckpt.mkdir(parents=True)
    if config_yaml is not None:
        (ckpt / checkpoint.CONFIG).write_text(config_yaml)
    (ckpt / checkpoint.DONE).write_text(json.dumps({"step": step}))
    return ckpt


def test_history_reads_what_earlier_runs_left_in_one_record(tmp_path, tiny_overrides):
    run = RunDir(tmp_path / "run")
    assert not run.history().has_results and run.history().done == 0  # a directory that does not exist yet
    run.path.mkdir()
    (run / "ckpt-000009.tmp").mkdir()  # an interrupted write: not a checkpoint
    _complete_checkpoint(run.path, 2)
    _complete_checkpoint(run.path, 4)
    (run / "ckpt-000006").mkdir()  # no DONE file: incomplete, passed over
    for name in ("checkpoint-3", "checkpoint-7", "checkpoint-x"):  # TRL's own; a non-numbered one counts as results
        (run / name).mkdir()
    past = run.history()
    assert [p.name for p in run.checkpoints()] == ["ckpt-000002", "ckpt-000004"]
    assert (past.checkpoint_step, past.trl_checkpoint_steps, past.summary_steps) == (4, (3, 7), 0)
    assert past.has_results and past.resumable == 7 and past.done == 7
    run.write_summary({"steps": 11})
    assert run.history().done == 11 and run.history().resumable == 7


def test_saved_config_is_the_newest_readable_checkpoints_else_config_yaml(tmp_path, tiny_overrides):
    import pytest

    from grpo_replay.trainer.rundir import RunDirError

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    _complete_checkpoint(run.path, 1)
    with pytest.raises(RunDirError, match="no config.yaml"):
        run.saved_config()
    (run / "config.yaml").write_text(resolve({**tiny_overrides, "seed": 5}).to_yaml())
    assert run.saved_config().seed == 5  # the checkpoint carries none: config.yaml
    _complete_checkpoint(run.path, 2, resolve({**tiny_overrides, "seed": 6}).to_yaml())
    _complete_checkpoint(run.path, 3, "{not: [valid")  # unreadable: passed over, like the resume passes it
    assert run.saved_config().seed == 6
