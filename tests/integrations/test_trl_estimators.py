"""`ReplayGRPOTrainer` under TRL's `scale_rewards` (group, batch, none) and several weighted reward functions,
through TRL's real `train()`: TRL's advantages are the core estimator of the same name (grpo, grpo_batch,
dr_grpo) over the weighted reward sum, a buffered row keeps the advantage TRL gave it when fresh (its |A|
priority derives from it), and a replayed row carries that same value into a later update."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

trl = pytest.importorskip("trl")
import torch  # noqa: E402

from test_trl import make_dataset, make_model, make_tokenizer, trl_kwargs  # noqa: E402

from grpo_replay import estimate  # noqa: E402

ESTIMATOR = {"group": "grpo", "batch": "grpo_batch", "none": "dr_grpo"}
WEIGHTS = [1.0, 0.5]


def _digits(completions, **_):
    return [float(hashlib.md5(c.encode()).digest()[0] % 3) / 2.0 for c in completions]  # 0, 0.5, 1


def _length(completions, **_):
    return [float(len(c) % 4) / 3.0 for c in completions]  # graded: 0, 1/3, 2/3, 1


def _run(tmp_path, scale: str, **kw):
    from grpo_replay.integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer

    class Recording(ReplayGRPOTrainer):
        seen: list = []

        def _replay_compose(self, out, rewards_per_func):
            self.seen.append((rewards_per_func.detach().cpu().clone(), out["advantages"].detach().cpu().clone()))
            return super()._replay_compose(out, rewards_per_func)

    Recording.seen = []
    args = ReplayGRPOConfig(**trl_kwargs(tmp_path, replay_preset="paper", max_steps=5, per_device_train_batch_size=8,
                                         scale_rewards=scale, reward_weights=WEIGHTS, replay_tau_max=4, **kw))
    trainer = Recording(model=make_model(0), reward_funcs=[_digits, _length], args=args, train_dataset=make_dataset(),
                        processing_class=make_tokenizer())
    trainer.train()
    return trainer


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_scale_rewards_and_reward_weights_reach_the_buffer(tmp_path, scale):
    trainer = _run(tmp_path, scale)
    hist = list(trainer.replay_history)
    assert len(trainer.seen) == len(hist) == 5
    fresh = []  # (reward, advantage) of every fresh row, over the run
    for (rpf, adv), h in zip(trainer.seen, hist):
        rewards = (rpf * torch.tensor(WEIGHTS)).sum(1)  # TRL's weighted sum (sum_then_normalize)
        groups = torch.arange(len(rewards)) // 4
        ours, _ = estimate(ESTIMATOR[scale], rewards, groups)
        torch.testing.assert_close(adv, ours, atol=2e-5, rtol=1e-5)  # TRL's implementation = the core's
        assert h["fresh_advantages"] == adv.tolist()
        fresh += list(zip(rewards.tolist(), adv.tolist()))
    if scale == "batch":  # one scale for the batch: not the per-group one
        rpf, adv = trainer.seen[0]
        rewards = (rpf * torch.tensor(WEIGHTS)).sum(1)
        assert not torch.allclose(adv, estimate("grpo", rewards, torch.arange(len(rewards)) // 4)[0], atol=1e-3)
    st = trainer.replay_buffer.storage
    slots = st.valid_slots()
    assert len(slots) > 0
    stored = list(zip(st.col("reward")[slots].tolist(), st.col("advantage")[slots].tolist()))
    for r, a in stored:  # each buffered row: a fresh row's weighted reward and TRL's advantage for it
        assert any(abs(r - fr) < 1e-6 and abs(a - fa) < 1e-6 for fr, fa in fresh), (r, a)
    cfg = trainer.replay_config
    adv = st.col("advantage")[slots].astype(np.float64)
    np.testing.assert_allclose(st.col("weight")[slots], np.power(np.abs(adv) + cfg.eps, cfg.alpha), rtol=1e-6)
    replayed = [a for h in hist for a in h["replay_advantages"]]
    assert replayed, "no replay row trained: the test would prove nothing"
    fresh_adv = [fa for _, fa in fresh]
    assert all(any(abs(a - fa) < 1e-6 for fa in fresh_adv) for a in replayed)  # frozen: its generation's value


def test_zero_variance_rows_stay_out_of_the_buffer_under_batch_scaling(tmp_path):
    """A group whose weighted rewards are all equal has A = 0 under every scale; it is never buffered."""
    trainer = _run(tmp_path, "batch")
    for (rpf, adv), h in zip(trainer.seen, trainer.replay_history):
        rewards = (rpf * torch.tensor(WEIGHTS)).sum(1).view(-1, 4)
        varying = int((rewards.max(1).values != rewards.min(1).values).sum()) * 4
        assert h["inserted"] == varying
        assert bool((adv.view(-1, 4)[rewards.max(1).values == rewards.min(1).values] == 0).all())


def test_backend_trl_trains_on_the_weighted_reward(tiny_overrides, tmp_path):
    """`train --backend trl` with reward_funcs / reward_weights: one TRL reward function per name, summed with the
    weights by TRL, each logged in metrics.jsonl as the built-in trainer logs it."""
    import json

    from grpo_replay.cli import main
    from helpers import read_jsonl

    weights = {"correct": 1.0, "digits": 0.5, "format": 0.1}
    ov = {**tiny_overrides, "steps": 2, "eval_every": 0, "checkpoint_every": 0,
          "reward_funcs": list(weights), "reward_weights": list(weights.values())}
    argv = ["train", "--backend", "trl", "--out", str(tmp_path / "run")]
    for k, v in ov.items():
        argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    assert main(argv) == 0
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 2
    for r in rows:
        means = {n: r[f"rewards/{n}/mean"] for n in weights}
        assert r["reward"] == pytest.approx(sum(w * means[n] for n, w in weights.items()), abs=1e-5)
    assert any(r["rewards/digits/mean"] > r["rewards/correct/mean"] for r in rows)  # partial credit was given
