"""TrainConfig.update_epochs (mu) in the built-in trainer's update: mu whole-batch optimizer steps, each PPO ratio
against the rows' behaviour log-probs (the first pass's for fresh rows)."""
import math
import types

import pytest
import torch

from grpo_replay.loss import LossConfig, ppo_clip_loss
from grpo_replay.trainer.logprobs import token_logps
from grpo_replay.trainer.update import epoch_metrics, update
from helpers import ToyLM, make_batch


LR = 5.0  # large, so that pass 2's ratios leave the clip range
LOSS = LossConfig(max_completion_length=7)


def _cfg(mu, micro=None, max_drift=None):
    return types.SimpleNamespace(update_epochs=mu, micro_batch_size=micro, temperature=1.0, max_grad_norm=0.0,
                                 replay=types.SimpleNamespace(max_drift=max_drift))


def _batch():
    b = make_batch(2, 4, seed=3)
    b.is_replay = torch.tensor([False] * 4 + [True] * 4)  # replay rows keep make_batch's stored log-probs
    return b


def _run(mu, micro=None):
    model = ToyLM()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    stats = update(model, opt, sched, _batch(), LOSS, _cfg(mu, micro))
    return model, sched, stats


def _by_hand(mu):
    """mu plain SGD steps on the whole batch, each ratio against pass 1's log-probs for the fresh rows."""
    model = ToyLM()
    b = _batch()
    logp = lambda: token_logps(model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)  # noqa: E731
    with torch.no_grad():
        b.behaviour_logps = torch.where(b.is_replay.unsqueeze(1), b.behaviour_logps, logp())
    for _ in range(mu):
        model.zero_grad()
        loss, _ = ppo_clip_loss(logp(), b, LOSS)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return model, b.behaviour_logps


def test_mu_updates_equal_mu_sgd_steps_against_the_first_pass_behaviour_logprobs():
    model, sched, stats = _run(2)
    want, behaviour = _by_hand(2)
    torch.testing.assert_close(model.emb.weight, want.emb.weight, rtol=1e-5, atol=1e-6)
    one, _ = _by_hand(1)
    assert not torch.allclose(model.emb.weight, one.emb.weight)  # the second pass moved the policy further
    # the fresh rows' behaviour log-probs are the first pass's (what the buffer stores), not the moved policy's
    torch.testing.assert_close(stats["fresh_logps"], behaviour[:4] * _batch().completion_mask[:4])
    assert sched.last_epoch == 1  # one schedule step per step, whatever mu


def test_the_clip_acts_on_fresh_rows_from_the_second_pass_on():
    model = ToyLM()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    stats = update(model, opt, sched, make_batch(2, 4, seed=3), LOSS, _cfg(3))  # fresh rows only
    first, second, third = stats["epochs"]
    assert first == {"clip_frac": 0.0, "approx_kl": 0.0}  # pass 1: every ratio is exactly 1
    assert third["approx_kl"] > second["approx_kl"] > 0  # each pass moves further from the behaviour policy
    assert third["clip_frac"] > 0  # and the clip starts to act on fresh rows


@pytest.mark.parametrize("micro", [3, 5])
def test_micro_batches_do_not_change_the_update(micro):
    whole, _, _ = _run(2)
    cut, _, _ = _run(2, micro)
    torch.testing.assert_close(cut.emb.weight, whole.emb.weight, rtol=1e-5, atol=1e-6)


def test_mu_1_has_no_per_pass_stats_and_mu_2_reports_both_passes():
    _, _, one = _run(1)
    assert "epochs" not in one
    _, _, two = _run(2)
    assert [sorted(p) for p in two["epochs"]] == [["approx_kl", "clip_frac"]] * 2
    assert two["loss"] == pytest.approx(one["loss"])  # the reported loss is the first pass's


def test_a_row_dropped_for_drift_in_any_pass_is_evicted():
    model = ToyLM()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    b = _batch()
    with torch.no_grad():
        now = token_logps(model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)
    b.behaviour_logps = now * b.completion_mask  # replay rows on-policy at pass 1: nothing dropped there
    two = update(model, opt, sched, b, LOSS, _cfg(2, max_drift=1e-3))
    assert not two["drift"].gt(1e-3).any()  # pass 1's drift is reported
    assert two["drift_dropped"][4:].any() and not two["drift_dropped"][:4].any()  # pass 2 dropped moved replay rows


def _later_passes_nonfinite(monkeypatch):
    """Every pass after the first computes NaN log-probs (before its optimizer step)."""
    import grpo_replay.trainer.update as upd

    real_pass, real_logps, later = upd._pass, upd.token_logps, {"on": False}

    def pass_(model, optimizer, batch, loss_cfg, cfg, behaviour):
        later["on"] = behaviour is not None
        return real_pass(model, optimizer, batch, loss_cfg, cfg, behaviour)

    monkeypatch.setattr(upd, "_pass", pass_)
    monkeypatch.setattr(upd, "token_logps", lambda *a, **k: real_logps(*a, **k) + (math.nan if later["on"] else 0.0))


def test_a_later_nonfinite_pass_keeps_pass_1_s_update_and_is_recorded(monkeypatch):
    _later_passes_nonfinite(monkeypatch)
    model, sched, stats = _run(3)
    want, _ = _by_hand(1)
    torch.testing.assert_close(model.emb.weight, want.emb.weight, rtol=1e-5, atol=1e-6)  # pass 1 stands, pass 2 none
    assert stats["finite"] and stats["nonfinite_pass"] == 2 and sched.last_epoch == 1
    row = epoch_metrics(stats, 3)
    assert row["epochs/passes"] == 2 and row["epochs/nonfinite_pass"] == 2


def test_a_later_nonfinite_pass_inserts_the_fresh_rows_and_is_no_bad_step(tiny_overrides, tmp_path, monkeypatch):
    import grpo_replay.trainer.loop as loop
    from grpo_replay.trainer.train_config import resolve
    from helpers import read_jsonl

    _later_passes_nonfinite(monkeypatch)
    out = tmp_path / "run"
    cfg = resolve({**tiny_overrides, "out_dir": str(out), "steps": 3, "eval_every": 0, "update_epochs": 2,
                   "max_bad_steps": 1})
    summary = loop.train(cfg)  # max_bad_steps=1 would stop the run at the first step counted bad
    rows = read_jsonl(out / "metrics.jsonl")
    updated = [r for r in rows if r["loss"] is not None]
    assert updated and all(not r["skipped_nonfinite"] and r["epochs/nonfinite_pass"] == 2 for r in updated)
    assert rows[-1]["buffer/size"] > 0 and summary["skipped_nonfinite_steps"] == 0
