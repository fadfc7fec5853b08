"""The advantage estimator and the weighted reward in short real runs of the built-in trainer on the tiny testbed:
each estimator's advantage is what a row carries into the buffer (frozen, with its |A| priority), the run's
config.yaml records it and a resume cannot change it; each reward function is logged, and their weighted sum is
the reward trained on."""
import json

import numpy as np
import pytest
import torch

import grpo_replay.trainer.loop as loop
from grpo_replay import ReplayBuffer
from grpo_replay.trainer import checkpoint
from grpo_replay.trainer.train_config import resolve
from helpers import estimator_loop, read_jsonl, refused, train_metrics, without_times

SETTINGS = [("grpo", "group", "grpo"), ("grpo", "none", "dr_grpo"), ("grpo", "batch", "grpo_batch"),
            ("rloo", "group", "rloo"), ("reinforce_plus_plus_baseline", "group", "reinforce_plus_plus_baseline")]


@pytest.mark.parametrize("estimator,scale,name", SETTINGS)
def test_the_estimator_gives_the_advantage_a_row_is_stored_and_prioritised_with(
        estimator, scale, name, tiny_overrides, tmp_path, monkeypatch):
    rounds = []  # (rewards, group_ids) of every generation round, in order
    real = loop.estimate

    def spy(est, rewards, group_ids, *a, **k):
        rounds.append((est, rewards.clone(), group_ids.clone()))
        return real(est, rewards, group_ids, *a, **k)

    monkeypatch.setattr(loop, "estimate", spy)
    out = tmp_path / "run"
    cfg = resolve({**tiny_overrides, "out_dir": str(out), "steps": 4, "checkpoint_every": 4, "eval_every": 0,
                   "replay.tau_max": 8, "advantage_estimator": estimator, "advantage_scale": scale})
    loop.train(cfg)
    assert [r[0] for r in rounds] == [name] * 4
    # every stored row's (birth step, reward, advantage) is one the per-row loop reference gives that step's round
    expected = set()
    for t, (_, r, g) in enumerate(rounds):
        ref = estimator_loop(name, r, g, 1e-4)
        expected |= {(t, float(ri), round(float(ai), 4)) for ri, ai in zip(r, ref)}
    buf = ReplayBuffer.load(checkpoint.latest(out) / "buffer", cfg.replay)
    st = buf.storage
    slots = st.valid_slots()
    adv = st.col("advantage")[slots]
    assert len(slots) > 0
    stored = {(int(b), float(r), round(float(a), 4))
              for b, r, a in zip(st.col("birth_step")[slots], st.col("reward")[slots], adv)}
    assert stored <= expected, stored - expected
    np.testing.assert_allclose(st.col("weight")[slots], np.power(np.abs(adv.astype(np.float64)) + cfg.replay.eps,
                                                                  cfg.replay.alpha), rtol=1e-6)
    saved = (out / "config.yaml").read_text()
    assert f"advantage_estimator: {estimator}" in saved and f"advantage_scale: {scale}" in saved


def test_estimators_differ_on_the_same_rollouts(tiny_overrides, tmp_path):
    """The setting takes effect: the same seed's first step trains on other advantages (the rollouts are the same)."""
    first = {}
    for est in ("grpo", "rloo", "reinforce_plus_plus_baseline"):
        first[est] = train_metrics(tiny_overrides, tmp_path / est, steps=1, eval_every=0, advantage_estimator=est)[0]
    assert len({r["reward"] for r in first.values()}) == 1
    assert len({r["fresh/abs_adv"] for r in first.values()}) == 3


def test_a_resume_cannot_change_the_estimator(tiny_overrides, tmp_path, capsys):
    out = tmp_path / "run"
    train_metrics(tiny_overrides, out, steps=2, eval_every=0)
    argv = ["train", "--out", str(out), "--no-progress"]
    for k, v in {**tiny_overrides, "steps": 4, "eval_every": 0, "advantage_estimator": "rloo"}.items():
        if k != "progress":
            argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    from grpo_replay.cli import main

    assert main(argv) == 2
    assert "advantage_estimator" in capsys.readouterr().err


@pytest.mark.parametrize("key,value,needle", [
    ("advantage_estimator", "gae", "TrainConfig.advantage_estimator='gae' is invalid; allowed: grpo, rloo, "
                                   "reinforce_plus_plus_baseline"),
    ("advantage_scale", "batch", "TrainConfig.advantage_scale='batch' is invalid; allowed: group (the default) with "
                                 "advantage_estimator='rloo'"),
    ("reward_funcs", '["correct","length"]', "TrainConfig.reward_funcs=('correct', 'length') is invalid; allowed: a "
                                             "list of correct, digits, format with reward='testbed'"),
    ("reward_weights", "[1.0,2.0]", "TrainConfig.reward_weights=(1.0, 2.0) is invalid; allowed: [] or one weight"),
])
def test_bad_estimator_and_reward_settings_are_refused_by_name(key, value, needle, tiny_overrides, tmp_path, capsys):
    out = tmp_path / "run"
    extra = ["--set", "advantage_estimator=rloo"] if key == "advantage_scale" else []
    refused(["train", "--out", str(out), "--set", f"{key}={value}", *extra], out, capsys, needle)


def test_weighted_reward_is_the_sum_of_its_logged_functions(tiny_overrides, tmp_path):
    weights = {"correct": 1.0, "digits": 0.5, "format": 0.1}
    rows = train_metrics(tiny_overrides, tmp_path / "graded", steps=3, eval_every=0,
                         reward_funcs=list(weights), reward_weights=list(weights.values()))
    for r in rows:
        means = {n: r[f"rewards/{n}/mean"] for n in weights}
        assert r["reward"] == pytest.approx(sum(w * means[n] for n, w in weights.items()), abs=1e-6)
        assert means["digits"] >= means["correct"]  # a right answer has every digit right
    assert any(r[f"rewards/digits/mean"] > r["rewards/correct/mean"] for r in rows)  # partial credit was given
    evals = read_jsonl(tmp_path / "graded" / "evals.jsonl")
    assert all(0 <= e["acc_sampled"] <= 1 for e in evals)  # the evaluation scores correctness only


def test_the_task_reward_as_a_weighted_sum_of_one_trains_the_same(tiny_overrides, tmp_path):
    plain = train_metrics(tiny_overrides, tmp_path / "plain", steps=2, eval_every=0)
    one = train_metrics(tiny_overrides, tmp_path / "one", steps=2, eval_every=0, reward_funcs=["correct"])
    assert [r.pop("rewards/correct/mean") for r in one] == [r["reward"] for r in plain]
    assert without_times(one) == without_times(plain)


def test_a_graded_run_resumes_with_its_reward_functions(tiny_overrides, tmp_path):
    """reward_funcs are part of the config a resume must match, and the run resumes with them."""
    out = tmp_path / "r"
    ov = dict(eval_every=0, reward_funcs=["digits", "format"], reward_weights=[0.9, 0.1])
    train_metrics(tiny_overrides, out, steps=2, **ov)
    rows = train_metrics(tiny_overrides, out, steps=4, **ov)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all("rewards/digits/mean" in r for r in rows)
    assert torch.tensor([r["reward"] for r in rows]).min() > 0  # format credit alone gives most rows > 0
