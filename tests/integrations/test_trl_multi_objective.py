"""Which fresh rows enter the buffer with several reward functions: decided on the advantages TRL trains on, under
both of TRL's `multi_objective_aggregation` modes."""
from __future__ import annotations

import hashlib

import pytest

trl = pytest.importorskip("trl")
import torch  # noqa: E402

from test_trl import make_dataset, make_model, make_tokenizer, trl_kwargs  # noqa: E402


def _r1(completions, **_):
    return [2.0 * (hashlib.md5(c.encode()).digest()[0] % 2) for c in completions]


def _r2(completions, **_):
    # r1 + 2 * r2 == 2 on every row: with weights (1, 2) the weighted reward sum never varies, while the
    # per-function normalised rewards of normalize_then_sum give advantages -z(r1), which do.
    return [1.0 - r / 2.0 for r in _r1(completions)]


def _run(tmp_path, aggregation: str):
    from grpo_replay.integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer

    class Recording(ReplayGRPOTrainer):
        def _replay_compose(self, out, rewards_per_func):
            self.trl_advantages = getattr(self, "trl_advantages", [])
            self.trl_advantages.append(out["advantages"].detach().cpu().clone())
            return super()._replay_compose(out, rewards_per_func)

    args = ReplayGRPOConfig(**trl_kwargs(tmp_path, replay_preset="paper", max_steps=3, per_device_train_batch_size=8,
                                         reward_weights=[1.0, 2.0], multi_objective_aggregation=aggregation))
    trainer = Recording(model=make_model(0), reward_funcs=[_r1, _r2], args=args, train_dataset=make_dataset(),
                        processing_class=make_tokenizer())
    trainer.train()
    return trainer


def _varying_rows(adv: torch.Tensor, G: int = 4) -> int:
    grouped = adv.view(-1, G)
    return int(((grouped.max(1).values != grouped.min(1).values).sum()) * G)


def test_normalize_then_sum_buffers_rows_trl_trains_on(tmp_path):
    trainer = _run(tmp_path, "normalize_then_sum")
    hist = list(trainer.replay_history)
    expected = [_varying_rows(a) for a in trainer.trl_advantages]
    assert sum(expected) > 0, "no group with varying advantages: the test would prove nothing"
    assert [h["inserted"] for h in hist] == expected
    assert len(trainer.replay_buffer) == sum(expected)
    assert sum(h["replay_rows"] for h in hist) > 0


def test_sum_then_normalize_constant_sum_buffers_nothing(tmp_path):
    trainer = _run(tmp_path, "sum_then_normalize")
    assert all(bool((a == 0).all()) for a in trainer.trl_advantages)
    assert [h["inserted"] for h in trainer.replay_history] == [0, 0, 0]
    assert len(trainer.replay_buffer) == 0
