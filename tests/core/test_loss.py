import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_replay import LossConfig, RolloutBatch, ppo_clip_loss
from helpers import make_batch


def _batch(adv, old, mask, ref=None):
    B, C = old.shape
    return RolloutBatch(
        prompt_ids=torch.ones(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.long),
        completion_ids=torch.ones(B, C, dtype=torch.long),
        completion_mask=mask,
        behaviour_logps=old,
        advantages=torch.tensor(adv),
        rewards=torch.zeros(B),
        group_ids=torch.zeros(B, dtype=torch.long),
        group_std=torch.zeros(B),
        birth_step=torch.zeros(B, dtype=torch.long),
        is_replay=torch.tensor([False, True]),
        ref_logps=ref,
    )


def test_hand_computed_example():
    # row 0: A = +1, ratios e^0.1=1.105 (inside), e^0.5=1.649 (clipped at 1.28), pad
    # row 1: A = -2, ratios e^-0.5=0.607 (clipped at 0.8), e^3=20.09 (dual-clipped at c=10)
    old = torch.zeros(2, 3)
    logps = torch.tensor([[0.1, 0.5, 9.0], [-0.5, 3.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    loss, stats = ppo_clip_loss(logps, _batch([1.0, -2.0], old, mask), LossConfig())
    t = [-math.exp(0.1), -1.28, 2 * 0.8, 2 * 10.0]
    assert loss.item() == pytest.approx(sum(t) / 4, rel=1e-6)
    assert stats["clipped"].tolist() == [[False, True, False], [True, True, False]]
    seq = ppo_clip_loss(logps, _batch([1.0, -2.0], old, mask), LossConfig(aggregation="seq_mean"))[0]
    assert seq.item() == pytest.approx(((t[0] + t[1]) / 2 + (t[2] + t[3]) / 2) / 2, rel=1e-6)
    dr = ppo_clip_loss(logps, _batch([1.0, -2.0], old, mask), LossConfig(aggregation="dr_grpo"))[0]
    assert dr.item() == pytest.approx(sum(t) / (2 * 3), rel=1e-6)
    no_dual = ppo_clip_loss(logps, _batch([1.0, -2.0], old, mask), LossConfig(dual_clip_c=None))[0]
    assert no_dual.item() == pytest.approx((t[0] + t[1] + t[2] + 2 * math.exp(3.0)) / 4, rel=1e-6)
    loss.backward()
    # gradient flows only through the unclipped token of row 0: d/dlogp(-A e^lp) = -e^0.1 / 4
    assert logps.grad.tolist()[0][0] == pytest.approx(-math.exp(0.1) / 4, rel=1e-5)
    assert logps.grad[0, 1] == 0 and logps.grad[1].abs().sum() == 0 and logps.grad[0, 2] == 0


def test_kl_term():
    old = torch.zeros(2, 2)
    logps = torch.zeros(2, 2)
    ref = torch.tensor([[0.5, 0.0], [0.0, 0.0]])
    b = _batch([0.0, 0.0], old, torch.ones(2, 2, dtype=torch.long), ref)
    loss, stats = ppo_clip_loss(logps, b, LossConfig(beta=0.1))
    assert loss.item() == pytest.approx(0.1 * (math.exp(0.5) - 0.5 - 1) / 4, rel=1e-6)
    with pytest.raises(ValueError, match="ref_logps"):
        ppo_clip_loss(logps, _batch([0.0, 0.0], old, torch.ones(2, 2, dtype=torch.long)), LossConfig(beta=0.1))


def _slow_loss(logps, batch, cfg):
    """Per-token Python loop reference."""
    B, C = logps.shape
    per_row, total, count = [], 0.0, 0
    for i in range(B):
        A = float(batch.advantages[i])
        row_sum, row_n = 0.0, 0
        for j in range(C):
            if not batch.completion_mask[i, j]:
                continue
            r = math.exp(float(logps[i, j]) - float(batch.behaviour_logps[i, j]))
            rc = min(max(r, 1 - cfg.eps_low), 1 + cfg.eps_high)
            l = max(-A * r, -A * rc)
            if cfg.dual_clip_c is not None and A < 0:
                l = min(l, -A * cfg.dual_clip_c)
            if cfg.beta > 0:
                d = float(batch.ref_logps[i, j]) - float(logps[i, j])
                l += cfg.beta * (math.exp(d) - d - 1)
            row_sum += l
            row_n += 1
        per_row.append(row_sum / max(row_n, 1))
        total += row_sum
        count += row_n
    if cfg.aggregation == "token_mean":
        return total / max(count, 1)
    if cfg.aggregation == "seq_mean":
        return sum(per_row) / B
    return total / (B * (cfg.max_completion_length or C))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    agg=st.sampled_from(["token_mean", "seq_mean", "dr_grpo"]),
    dual=st.sampled_from([None, 3.0, 10.0]),
    beta=st.sampled_from([0.0, 0.05]),
)
def test_matches_slow_loop(seed, agg, dual, beta):
    b = make_batch(3, 3, seed=seed, with_ref=True)
    b.is_replay[::2] = True
    g = torch.Generator().manual_seed(seed)
    logps = b.behaviour_logps + torch.randn(b.behaviour_logps.shape, generator=g) * 0.6
    cfg = LossConfig(aggregation=agg, dual_clip_c=dual, beta=beta)
    fast, _ = ppo_clip_loss(logps.double(), b, cfg)
    assert fast.item() == pytest.approx(_slow_loss(logps.double(), b, cfg), rel=1e-6, abs=1e-9)


@pytest.mark.parametrize(
    "kw,msg",
    [({"eps_low": 1.5}, "eps_low"), ({"dual_clip_c": 0.5}, "dual_clip_c"), ({"aggregation": "sum"}, "dr_grpo, seq_mean, token_mean"), ({"beta": -1}, "beta")],
)
def test_invalid_loss_config(kw, msg):
    with pytest.raises(ValueError, match=msg):
        LossConfig(**kw)


@pytest.mark.parametrize("shape", ["B1", "1C", "C", "BC+1"])
def test_logps_of_another_shape_are_refused(shape):
    """(B, 1), (1, C) or (C,) log-probs would broadcast against the (B, C) batch to a plausible number."""
    batch = make_batch(2, 4, seed=1)
    B, C = batch.completion_ids.shape
    logps = {"B1": torch.zeros(B, 1), "1C": torch.zeros(1, C), "C": torch.zeros(C), "BC+1": torch.zeros(B, C + 1)}[shape]
    with pytest.raises(ValueError, match=r"ppo_clip_loss: logps has shape .* allowed: exactly \(8, "):
        ppo_clip_loss(logps, batch)


@pytest.mark.parametrize("value", [2, -1])
def test_a_mask_that_is_not_0_or_1_is_refused(value):
    """The buffer keeps masks as bool: a weight-like mask would give a replayed row another loss."""
    batch = make_batch(2, 4, seed=1)
    batch.completion_mask = batch.completion_mask.clone()
    batch.completion_mask[0, 0] = value
    with pytest.raises(ValueError, match=f"completion_mask holds {value}; allowed: 0 or 1"):
        ppo_clip_loss(batch.behaviour_logps.clone(), batch)
    batch.completion_mask = batch.completion_mask.float().clamp(0, 1)  # 0.0/1.0 floats are a mask too
    loss, _ = ppo_clip_loss(batch.behaviour_logps.clone(), batch)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_masked_positions_do_not_influence_loss_or_gradient(beta):
    """-inf (or NaN) at a masked position of behaviour, reference or current log-probs changes nothing."""
    batch = make_batch(2, 4, seed=1, with_ref=True)
    batch.behaviour_logps = batch.behaviour_logps - 0.3 * batch.completion_mask
    cfg = LossConfig(beta=beta)
    pad = batch.completion_mask == 0
    assert bool(pad.any())
    logps = (batch.behaviour_logps + 0.05).clone().requires_grad_(True)
    ref_loss, _ = ppo_clip_loss(logps, batch, cfg)
    ref_loss.backward()
    ref_grad = logps.grad.clone()
    dirty = batch.select(torch.arange(len(batch)))
    dirty.behaviour_logps = torch.where(pad, float("-inf"), batch.behaviour_logps)
    dirty.ref_logps = torch.where(pad, float("-inf"), batch.ref_logps)
    logps2 = torch.where(pad, float("nan"), logps.detach()).requires_grad_(True)
    loss, _ = ppo_clip_loss(logps2, dirty, cfg)
    loss.backward()
    assert torch.equal(loss, ref_loss) and torch.equal(logps2.grad, ref_grad)


def test_replay_drift_is_the_mean_k3_kl_of_each_replayed_row():
    from grpo_replay.loss import replay_drift

    b = make_batch(1, 3, seed=0)
    b.is_replay = torch.tensor([False, True, True])
    b.completion_mask = torch.zeros_like(b.completion_mask)
    b.completion_mask[:, :2] = 1
    b.completion_mask[2] = 0  # a replayed row without counted tokens
    b.behaviour_logps = torch.zeros_like(b.behaviour_logps)
    logps = torch.full(b.behaviour_logps.shape, float("nan"))  # padding may hold anything
    logps[:, 0], logps[:, 1] = math.log(0.5), math.log(2.0)
    d = replay_drift(logps, b)
    k3 = lambda x: math.exp(x) - 1 - x  # noqa: E731
    assert d[0] == 0 and d[2] == 0  # fresh row; no counted tokens
    assert d[1].item() == pytest.approx((k3(math.log(0.5)) + k3(math.log(2.0))) / 2)
    assert not d.requires_grad
