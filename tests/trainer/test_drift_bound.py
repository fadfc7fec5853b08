"""replay.max_drift in the built-in trainer's update: drifted replay rows leave the loss exactly."""
import types

import pytest
import torch

from grpo_replay.loss import LossConfig
from grpo_replay.session import over_drift_bound
from grpo_replay.trainer import drift_bound
from grpo_replay.trainer.logprobs import token_logps
from grpo_replay.trainer.loop import _update
from helpers import ToyLM, make_batch


def _batch(model):
    b = make_batch(2, 4, seed=3)
    b.is_replay = torch.tensor([False] * 4 + [True] * 4)
    with torch.no_grad():
        now = token_logps(model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)
    far = torch.tensor([False] * 5 + [True, False, True])  # replay rows 5 and 7 drifted, 4 and 6 did not
    b.behaviour_logps = torch.where(far.unsqueeze(1), now - 3.0, now) * b.completion_mask
    return b, far


def _step(batch, aggregation, max_drift, micro):
    model = ToyLM()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    cfg = types.SimpleNamespace(micro_batch_size=micro, temperature=1.0, max_grad_norm=0.0, update_epochs=1,
                                replay=types.SimpleNamespace(max_drift=max_drift))
    stats = _update(model, opt, sched, batch, LossConfig(aggregation=aggregation, max_completion_length=7), cfg)
    return model.emb.weight.detach(), stats


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "dr_grpo"])
def test_drifted_rows_are_masked_out_and_the_update_equals_one_without_them(aggregation):
    batch, far = _batch(ToyLM())
    with_bound, stats = _step(batch, aggregation, max_drift=1.0, micro=3)  # micro-batches 3 + 3 + 2
    without_rows, _ = _step(batch.select((~far).nonzero().squeeze(1)), aggregation, max_drift=None, micro=None)
    assert stats["drift_dropped"].tolist() == far.tolist()
    assert (stats["drift"][far] > 1.0).all() and (stats["drift"][~far] < 1e-6).all()
    torch.testing.assert_close(with_bound, without_rows, rtol=1e-5, atol=1e-6)
    unbounded, _ = _step(batch, aggregation, max_drift=None, micro=3)
    assert not torch.allclose(unbounded, without_rows)  # the dropped rows did weigh in without the bound


def test_an_update_whose_every_row_drifted_does_not_step():
    batch, _ = _batch(ToyLM())
    rep = batch.select(torch.tensor([5, 7]))
    before = ToyLM().emb.weight.detach().clone()
    after, stats = _step(rep, "token_mean", max_drift=1.0, micro=None)
    assert stats["loss"] is None and stats["finite"] and bool(stats["drift_dropped"].all())
    assert torch.equal(before, after)


def _bound_on(monkeypatch, drift: torch.Tensor, is_replay: torch.Tensor, bound: float) -> torch.Tensor:
    """The rows `DriftBound.apply` drops when the measured drift is `drift`."""
    monkeypatch.setattr(drift_bound, "replay_drift", lambda logps, part: drift)
    part = make_batch(2, 4, seed=0)
    part.is_replay = is_replay
    return drift_bound.DriftBound(bound).apply(part, torch.zeros(len(part), 1)).completion_mask.sum(1).eq(0)


def test_a_row_exactly_at_the_bound_stays_as_the_core_rule_says(monkeypatch):
    """The bound is the core's `over_drift_bound` (strictly above, replayed rows only), not a copy of it: on a tie,
    just above, and on a fresh row above, the update drops exactly the rows that rule names."""
    bound = 0.25
    drift = torch.tensor([0.0, bound, float(torch.nextafter(torch.tensor(bound), torch.tensor(1.0))), 0.9] * 2)
    is_replay = torch.tensor([True] * 4 + [False] * 4)
    assert over_drift_bound(is_replay, drift, bound).tolist() == [False, False, True, True] + [False] * 4
    assert _bound_on(monkeypatch, drift, is_replay, bound).tolist() == over_drift_bound(is_replay, drift, bound).tolist()


def test_the_update_calls_the_core_rule(monkeypatch):
    """Another rule in the core's place (>= instead of >) changes which rows the update drops: it asks the core."""
    bound = 0.25
    drift = torch.tensor([bound] * 8)
    monkeypatch.setattr(drift_bound, "over_drift_bound", lambda r, d, b: r.cpu() & (d.cpu() >= b))
    assert _bound_on(monkeypatch, drift, torch.tensor([True] * 4 + [False] * 4), bound).tolist() == [True] * 4 + [False] * 4
