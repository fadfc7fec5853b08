"""One test per row of the table in docs/reliability.md ("Bad input and crashes"): what a user gets for each kind of bad input."""
import json
import logging
import math
import threading
import time

import pytest
import torch
from helpers import read_jsonl, refused

from grpo_replay.cli import main
from grpo_replay.app.data import DataError, load_problems
from grpo_replay.trainer import checkpoint
from grpo_replay.trainer.rewards import RewardScorer

GOOD = '{"problem": "1+1?", "answer": "2"}\n'



# --- config ------------------------------------------------------------------------------------------------
def test_config_unknown_key_suggests_the_closest(train_args, tmp_path, capsys):
    out = tmp_path / "run"
    refused(train_args(out, **{"replay.tau_maxx": 3}), out, capsys,
                          "config error: unknown config key 'replay.tau_maxx'; did you mean 'replay.tau_max'?")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("replay:\n  replay_ration: 0.5\n")
    refused(["train", "--config", str(cfg), "--out", str(out)], out, capsys,
                          "'replay.replay_ration'; did you mean 'replay.replay_ratio'?")


def test_config_wrong_type_names_the_field(train_args, tmp_path, capsys):
    out = tmp_path / "run"
    refused(train_args(out, steps="ten"), out, capsys, "steps='ten' has the wrong type; expected int")
    refused(train_args(out, **{"loss.eps_high": "wide"}), out, capsys, "loss.eps_high='wide' has the wrong type")


def test_config_out_of_range_names_the_field(train_args, tmp_path, capsys):
    out = tmp_path / "run"
    refused(train_args(out, group_size=1), out, capsys, "TrainConfig.group_size=1 is invalid")
    refused(train_args(out, **{"replay.replay_ratio": -0.5}), out, capsys, "replay_ratio=-0.5 is invalid")
    refused(train_args(out, lr=0), out, capsys, "TrainConfig.lr=0.0 is invalid; allowed: a finite number > 0")


def test_config_file_not_yaml_or_not_a_mapping(tmp_path, capsys):
    out = tmp_path / "run"
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1, 2\n")
    refused(["train", "--config", str(bad), "--out", str(out)], out, capsys, "is not valid YAML")
    bad.write_text("- steps\n")
    refused(["train", "--config", str(bad), "--out", str(out)], out, capsys, "must hold a mapping")
    refused(["train", "--config", str(tmp_path / "nope.yaml"), "--out", str(out)], out, capsys, "does not exist")


# --- data --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, reason",
    [
        (b'{"problem": "1+1?"}\n', "missing field 'answer'"),
        (b'{"problem": "1+1?", "answer": "  "}\n', "empty field 'answer'"),
        (b'{"problem": "1+1?", "answer": "2"\n', "invalid JSON"),
        (b'{"problem": "caf\xe9", "answer": "2"}\n', "not valid UTF-8"),
    ],
    ids=["missing-field", "empty-answer", "invalid-json", "non-utf8"],
)
def test_data_error_names_file_and_line(tmp_path, line, reason):
    path = tmp_path / "train.jsonl"
    path.write_bytes(GOOD.encode() * 2 + line + GOOD.encode())
    with pytest.raises(DataError) as e:
        load_problems(path)
    assert str(e.value).startswith(f"{path}:3: ") and reason in str(e.value)
    assert (e.value.where, e.value.line) == (str(path), 3)


def test_data_skip_policy_counts_and_reports(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(GOOD.encode() + b'{"problem": "x"}\n' + b"\xff\xfe\n" + b"{oops\n" + GOOD.encode())
    with pytest.warns(UserWarning, match=r"skipped 3 malformed row\(s\)"):
        probs = load_problems(path, on_error="skip")
    assert len(probs) == 2 and [e.line for e in probs.skipped] == [2, 3, 4]


def test_data_error_through_the_cli(reference_run, tmp_path, capsys):
    """A bad row in --data stops `grpo-replay train` with the file and line, exit 2, no traceback."""
    model_dir = json.loads((reference_run / "summary.json").read_text())["setup"]["warm_start"]["cache_path"]
    data = tmp_path / "train.jsonl"
    data.write_text(GOOD * 3 + '{"problem": "2+2?", "answer": ""}\n')
    argv = ["train", "--reward", "math", "--model", model_dir, "--data", str(data), "--out", str(tmp_path / "run"),
            "--no-progress", "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"grpo-replay train: error: {data}:4: empty field 'answer'" in err and "Traceback" not in err


# --- model -------------------------------------------------------------------------------------------------
def _math_argv(tmp_path, model):
    data = tmp_path / "train.jsonl"
    data.write_text(GOOD * 4)
    # eval_problems below the 4 rows: a data file too small to hold them out is refused before the model loads
    return ["train", "--reward", "math", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "run"),
            "--no-progress", "--device", "cpu", "--set", "eval_problems=2"]


def test_model_path_that_does_not_exist(tmp_path, capsys):
    assert main(_math_argv(tmp_path, tmp_path / "no-such-model")) == 2
    assert f"error: TrainConfig.model: {tmp_path / 'no-such-model'} does not exist" in capsys.readouterr().err


def test_a_file_not_found_mid_training_is_not_reported_as_bad_input(train_args, reference_run, tmp_path, monkeypatch):
    """Only a path the user gave is bad input (exit 2); a FileNotFoundError raised while training is a failure
    with its traceback, not "rerun with other input"."""
    from grpo_replay.trainer import loop

    def lost(*_a, **_k):
        raise FileNotFoundError("a file the run itself wrote is gone")

    monkeypatch.setattr(loop, "step", lost)
    with pytest.raises(FileNotFoundError, match="a file the run itself wrote is gone"):
        main(train_args(tmp_path / "run"))


def test_model_that_is_not_a_causal_lm(tmp_path, capsys):
    from transformers import ViTConfig

    vit = tmp_path / "vit"
    ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32).save_pretrained(vit)
    assert main(_math_argv(tmp_path, vit)) == 2
    err = capsys.readouterr().err
    assert "is a ViTConfig (model_type 'vit'), not a causal LM" in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    assert main(_math_argv(tmp_path, tmp_path / "empty")) == 2
    assert "cannot load a model config from" in capsys.readouterr().err


# --- reward ------------------------------------------------------------------------------------------------
def test_reward_that_raises_or_hangs_scores_zero_is_counted_and_logged(train_args, reference_run, tmp_path, monkeypatch, caplog):
    """First call hangs past the timeout, every 7th raises: the run finishes; per-step counts in metrics.jsonl,
    totals in summary.json, a warning with the cause in the log. Evaluation rewards are guarded too."""
    from grpo_replay.tasks.testbed import TestbedTask

    real = TestbedTask.reward
    calls = []

    def flaky(self, text, problem):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(1.5)
        if len(calls) % 7 == 0:
            raise KeyError("grader crashed")
        return real(self, text, problem)

    monkeypatch.setattr(TestbedTask, "reward", flaky)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="grpo_replay.trainer"):
        assert main(train_args(out, steps=2, reward_timeout=0.5)) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward_timeouts"] == 1  # the first call: in the initial evaluation
    assert sum(r["reward/errors"] for r in rows) > 0 and summary["reward_errors"] >= sum(r["reward/errors"] for r in rows)
    assert "timed out after 0.5s" in caplog.text and "raised KeyError: 'grader crashed'" in caplog.text


def test_reward_scorer_abandons_a_hung_call(caplog):
    release = threading.Event()

    def reward(text, problem):
        if text == "hang":
            release.wait()  # never returns until the test ends
        if text == "raise":
            raise ZeroDivisionError
        if text == "nan":
            return math.nan
        return 1.0

    scorer = RewardScorer(reward, timeout=0.2)
    try:
        rs, counts = scorer(["ok", "hang", "ok", "raise", "nan", "ok"], [None] * 6)
        assert rs == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
        assert counts == {"reward/errors": 2, "reward/timeouts": 1}
        assert scorer.score_one("hang", None) == 0.0 and scorer.timeouts == 2
        assert all(t.daemon for t in threading.enumerate() if t.name == "reward")  # a hung call never blocks exit
    finally:
        release.set()


# --- loss --------------------------------------------------------------------------------------------------
def _nan_loss_on(monkeypatch, bad_calls):
    import grpo_replay.trainer.update as update  # the update calls the loss (once per micro-batch and epoch)

    real = update.ppo_clip_loss
    calls = []

    def loss(*a, **k):
        calls.append(1)
        out, stats = real(*a, **k)
        return (out * math.nan if len(calls) in bad_calls else out), stats

    monkeypatch.setattr(update, "ppo_clip_loss", loss)


def test_a_nan_loss_skips_the_step_and_is_counted(train_args, tmp_path, monkeypatch):
    _nan_loss_on(monkeypatch, {3})
    out = tmp_path / "run"
    assert main(train_args(out, steps=4)) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    skipped = [r for r in rows if r["skipped_nonfinite"]]
    assert len(skipped) == 1 and skipped[0]["loss"] is None
    assert json.loads((out / "summary.json").read_text())["skipped_nonfinite_steps"] == 1
    assert all(r["loss"] is None or math.isfinite(r["loss"]) for r in rows)


def test_k_nan_losses_in_a_row_stop_the_run_with_a_checkpoint(train_args, tmp_path, monkeypatch, capsys):
    _nan_loss_on(monkeypatch, set(range(1, 100)))
    out = tmp_path / "run"
    assert main(train_args(out, max_bad_steps=2)) == 1
    err = capsys.readouterr().err
    assert "stopped: 2 consecutive steps had a non-finite loss" in err and "checkpoint written to" in err
    ck = checkpoint.latest(out)
    state = json.loads((ck / checkpoint.DONE).read_text())
    assert state["bad_in_a_row"] == 2 and state["step"] == len(read_jsonl(out / "metrics.jsonl"))
    weights = __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(ck / "model" / "model.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_a_resumed_run_counts_the_reward_errors_of_the_steps_before_the_stop(train_args, reference_run, tmp_path,
                                                                             monkeypatch):
    """summary.json's reward_errors after a crash and resume equals the uninterrupted run's: the totals live in
    each checkpoint, not only in the last process."""
    import zlib

    from grpo_replay.tasks.testbed import TestbedTask
    from grpo_replay.trainer import loop

    real, real_step = TestbedTask.reward, loop.step

    def flaky(self, text, problem):  # deterministic in the text, so both runs fail on the same completions
        if zlib.crc32(text.encode()) % 5 == 0:
            raise KeyError("grader crashed")
        return real(self, text, problem)

    def crash_in_step_3(run, t):
        if t == 2:
            raise RuntimeError("killed in step 3")
        return real_step(run, t)

    monkeypatch.setattr(TestbedTask, "reward", flaky)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert main(train_args(whole, steps=4, checkpoint_every=1)) == 0
    monkeypatch.setattr(loop, "step", crash_in_step_3)
    with pytest.raises(RuntimeError, match="killed in step 3"):
        main(train_args(resumed, steps=4, checkpoint_every=1))
    monkeypatch.setattr(loop, "step", real_step)
    assert main(train_args(resumed, steps=4, checkpoint_every=1)) == 0
    rows = read_jsonl(resumed / "metrics.jsonl")
    want = json.loads((whole / "summary.json").read_text())["reward_errors"]
    got = json.loads((resumed / "summary.json").read_text())["reward_errors"]
    assert sum(r["reward/errors"] for r in rows[:2]) > 0 and got == want
