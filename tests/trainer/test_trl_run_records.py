"""`--backend trl` runs keep the built-in trainer's records and resume rules: metrics.jsonl under the same names
(so `grpo-replay plot` reads either), a resume never relabels a run with fewer steps than it has done, and a
finished run without a checkpoint is never trained over."""
import json
import shutil

import pytest
from helpers import read_jsonl

from grpo_replay.cli import main

pytest.importorskip("trl")


def _argv(tiny_overrides, out, **extra):
    argv = ["train", "--out", str(out), "--no-progress"]
    for k, v in {**tiny_overrides, "replay.warmup_steps": 1, **extra}.items():
        if k != "progress":
            argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return argv


def _snapshot(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tiny_overrides, tmp_path_factory):
    """A 3-step run of each backend (checkpoints at steps 2 and 3)."""
    root = tmp_path_factory.mktemp("runs")
    for backend in ("builtin", "trl"):
        assert main(_argv(tiny_overrides, root / backend, steps=3, backend=backend)) == 0
    return root


def test_a_trl_run_writes_metrics_jsonl_under_the_builtin_names(runs, tmp_path, capsys):
    trl, builtin = read_jsonl(runs / "trl" / "metrics.jsonl"), read_jsonl(runs / "builtin" / "metrics.jsonl")
    assert [r["step"] for r in trl] == [1, 2, 3]
    assert [r["generated"] for r in trl] == [r["generated"] for r in builtin] == [32, 64, 96]
    names = set().union(*builtin) | {"kl"}  # kl: logged by both when loss.beta > 0
    for row in trl:
        assert set(row) <= names, set(row) - names
        for key in ("reward", "frac_zero_var_groups", "completion_len", "loss", "grad_norm", "lr", "replay/share",
                    "update_rows", "fresh/count", "replay/count", "buffer/size"):
            assert isinstance(row[key], (int, float)), key
        assert 0 <= row["replay/share"] <= 1 and row["update_rows"] == row["fresh/count"] + row["replay/count"]
    hist = json.loads((runs / "trl" / "trl_summary.json").read_text())["replay_history"]
    assert [r["replay/count"] for r in trl] == [h["replay_rows"] for h in hist]
    assert trl[0]["replay/count"] == 0 and trl[-1]["replay/count"] > 0  # warm-up 1 step, then replay
    out = tmp_path / "p.png"
    assert main(["plot", str(runs / "trl"), str(runs / "builtin"), "--out", str(out)]) == 0
    table = {r["run_dir"]: r for r in json.loads(out.with_suffix(".json").read_text())}
    row = table[str(runs / "trl")]
    assert row["steps"] == "3/3" and row["generated"] == 96 and row["replay_share_mean"] > 0
    assert row["reward_last10"] == pytest.approx(sum(r["reward"] for r in trl) / 3)


@pytest.mark.parametrize("backend", ["builtin", "trl"])
def test_fewer_steps_than_a_run_has_done_is_refused_for_both_backends(runs, tiny_overrides, backend, tmp_path, capsys):
    run = tmp_path / backend
    shutil.copytree(runs / backend, run)
    before = _snapshot(run)
    assert main(_argv(tiny_overrides, run, steps=2, backend=backend)) == 2
    assert "TrainConfig.steps=2 is below the 3 steps the run" in capsys.readouterr().err
    assert _snapshot(run) == before


def test_a_resumed_trl_run_continues_its_metrics_without_repeating_steps(runs, tiny_overrides, tmp_path):
    run = tmp_path / "trl"
    shutil.copytree(runs / "trl", run)
    assert main(_argv(tiny_overrides, run, steps=4, backend="trl")) == 0
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[:3] == read_jsonl(runs / "trl" / "metrics.jsonl")  # the first run's rows, kept
    assert json.loads((run / "summary.json").read_text())["steps"] == 4


def test_a_finished_trl_run_without_checkpoints_is_not_trained_over(tiny_overrides, tmp_path, capsys):
    run = tmp_path / "trl"
    assert main(_argv(tiny_overrides, run, steps=2, backend="trl", checkpoint_every=0)) == 0
    assert not list(run.glob("checkpoint-*"))
    before = _snapshot(run)
    capsys.readouterr()
    assert main(_argv(tiny_overrides, run, steps=2, backend="trl", checkpoint_every=0)) == 0
    assert "has already done its 2 steps; nothing to train" in capsys.readouterr().err
    assert main(_argv(tiny_overrides, run, steps=3, backend="trl", checkpoint_every=0)) == 2
    assert "finished its 2 steps without a checkpoint at step 2, so it cannot be continued" in capsys.readouterr().err
    rewritten = ("config.yaml", ".grpo-replay.lock")  # by the accepted rerun's claim, with the same config
    assert ({k: v for k, v in _snapshot(run).items() if k not in rewritten}
            == {k: v for k, v in before.items() if k not in rewritten})


@pytest.mark.slow
def test_a_trl_run_stopped_and_resumed_has_the_uninterrupted_run_s_summary(runs, tiny_overrides, tmp_path,
                                                                           monkeypatch):
    from grpo_replay.integrations.trl import ReplayGRPOTrainer

    whole = tmp_path / "whole"
    assert main(_argv(tiny_overrides, whole, steps=4, backend="trl")) == 0
    real_step = ReplayGRPOTrainer.training_step

    def crash_in_step_3(self, *args, **kwargs):
        if self.state.global_step == 2:
            raise RuntimeError("killed in step 3")
        return real_step(self, *args, **kwargs)

    run = tmp_path / "resumed"
    monkeypatch.setattr(ReplayGRPOTrainer, "training_step", crash_in_step_3)
    with pytest.raises(RuntimeError, match="killed in step 3"):
        main(_argv(tiny_overrides, run, steps=4, backend="trl"))  # checkpoint-2 (checkpoint_every=2) is left
    monkeypatch.setattr(ReplayGRPOTrainer, "training_step", real_step)
    assert main(_argv(tiny_overrides, run, steps=4, backend="trl")) == 0  # resumes from checkpoint-2
    rows, summary = read_jsonl(run / "metrics.jsonl"), json.loads((run / "summary.json").read_text())
    want = json.loads((whole / "summary.json").read_text())
    counts = [r["replay/count"] for r in rows]
    assert counts == [r["replay/count"] for r in read_jsonl(whole / "metrics.jsonl")]
    assert summary["resumed_from"].endswith("checkpoint-2") and sum(counts[2:]) < sum(counts)
    assert summary["replay_rows_total"] == want["replay_rows_total"] == sum(counts)
    assert {k: v for k, v in summary.items() if k != "resumed_from"} == {k: v for k, v in want.items() if k != "resumed_from"}
    # a run continued with more --steps counts the steps of the run it continues
    more = tmp_path / "more"
    shutil.copytree(runs / "trl", more)
    assert main(_argv(tiny_overrides, more, steps=4, backend="trl")) == 0
    total = json.loads((more / "summary.json").read_text())["replay_rows_total"]
    assert total == sum(r["replay/count"] for r in read_jsonl(more / "metrics.jsonl"))


def test_both_backends_log_one_lr_sequence(tiny_overrides, tmp_path):
    """`lr` is the rate each step's update used, on one warm-up shape: update k uses lr * min(1, k / warm-up)."""
    lr, warm = 3e-3, 3
    want = [lr * min(1.0, k / warm) for k in (1, 2, 3, 4)]
    builtin, trl = tmp_path / "builtin", tmp_path / "trl"
    assert main(_argv(tiny_overrides, builtin, steps=4, lr=lr, lr_warmup_steps=warm, eval_every=0)) == 0
    assert main(_argv(tiny_overrides, trl, steps=2, lr=lr, lr_warmup_steps=warm, eval_every=0, backend="trl")) == 0
    assert main(_argv(tiny_overrides, trl, steps=4, lr=lr, lr_warmup_steps=warm, eval_every=0, backend="trl")) == 0
    for run in (builtin, trl):  # the TRL run resumed at step 2: the schedule continues where it was
        assert [r["lr"] for r in read_jsonl(run / "metrics.jsonl")] == pytest.approx(want, rel=1e-6), run.name
