import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_replay import ReplayBuffer, ReplayConfig
from helpers import make_batch


def test_roundtrip_tokens_and_fields():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None), seed=1)
    fresh = make_batch(n_groups=3, group_size=4, step=5, seed=3, with_ref=True)
    buf.add(fresh, step=5)
    out = buf.gather(buf.storage.valid_slots())
    assert out.is_replay.all() and len(out) == len(fresh)
    for i in range(len(fresh)):
        pm, cm = fresh.prompt_mask[i].bool(), fresh.completion_mask[i].bool()
        assert out.prompt_ids[i][out.prompt_mask[i].bool()].tolist() == fresh.prompt_ids[i][pm].tolist()
        assert out.prompt_mask[i, -1] == 1  # left-padded
        c = int(cm.sum())
        assert out.completion_ids[i, :c].tolist() == fresh.completion_ids[i, :c].tolist()
        assert out.completion_mask[i, :c].all() and not out.completion_mask[i, c:].any()  # right-padded
        assert torch.equal(out.behaviour_logps[i, :c], fresh.behaviour_logps[i, :c])
        assert torch.equal(out.ref_logps[i, :c], fresh.ref_logps[i, :c])
    assert torch.equal(out.advantages, fresh.advantages) and torch.equal(out.rewards, fresh.rewards)
    assert torch.equal(out.group_std, fresh.group_std) and (out.birth_step == 5).all()
    # stored compactly: int32 ids, float32 log-probs, unpadded
    pids, cids, lp, m, ref = buf.storage.tokens(int(buf.storage.valid_slots()[0]))
    assert pids.dtype == np.int32 and cids.dtype == np.int32 and lp.dtype == np.float32 and len(lp) == int(fresh.completion_mask[0].sum())


def test_group_ids_are_buffer_unique():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0), seed=0)
    buf.add(make_batch(2, 4, step=0, seed=0), 0)
    buf.add(make_batch(2, 4, step=1, seed=1), 1)  # same local ids 0, 1
    keys = buf.storage.col("group_key")[buf.storage.valid_slots()]
    assert len(np.unique(keys)) == 4


def test_rejects_non_finite_advantages_and_replay_rows():
    buf = ReplayBuffer(seed=0)
    b = make_batch(1, 4)
    b.advantages[2] = float("nan")
    with pytest.raises(ValueError, match=r"advantages must be finite; rows \[2\]"):
        buf.add(b, 0)
    b = make_batch(1, 4)
    b.advantages[0] = float("inf")
    with pytest.raises(ValueError, match="finite"):
        buf.add(b, 0)
    b = make_batch(1, 4)
    b.behaviour_logps = b.behaviour_logps[:, :-1]
    with pytest.raises(ValueError, match="behaviour_logps has shape"):
        buf.add(b, 0)
    b = make_batch(1, 4)
    b.is_replay[:] = True
    with pytest.raises(ValueError, match="fresh"):
        buf.add(b, 0)
    assert len(buf) == 0


def test_empty_draw_when_empty_or_warmup():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=3), seed=0)
    assert len(buf.sample(8, step=10)) == 0  # empty buffer
    buf.add(make_batch(), 0)
    assert len(buf.sample(8, step=2)) == 0  # warm-up
    assert len(buf.sample(8, step=3)) == 8
    assert len(ReplayBuffer(ReplayConfig.grpo(warmup_steps=0)).sample(4, 0)) == 0


@settings(max_examples=60, deadline=None)
@given(
    tau_max=st.one_of(st.none(), st.integers(0, 6)),
    plan=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20)), min_size=1, max_size=12),
    seed=st.integers(0, 2**16),
)
def test_never_samples_older_than_tau_max_and_evicts_exactly(tau_max, plan, seed):
    """Steps advance by random gaps; after each draw, sampled ages <= tau_max and the stored set is
    exactly the inserted rows with age <= tau_max."""
    buf = ReplayBuffer(ReplayConfig(tau_max=tau_max, warmup_steps=0, capacity=None), seed=seed)
    step, births = 0, []
    for i, (gap, n_draw) in enumerate(plan):
        step += gap
        out = buf.sample(n_draw, step)
        if tau_max is not None:
            assert all(a <= tau_max for a in out.age(step).tolist())
            expected = sum(1 for b in births if step - b <= tau_max)
        else:
            expected = len(births)
        assert len(buf) == expected
        assert len(out) == min(n_draw, expected)
        assert len(set(buf.storage.valid_slots().tolist())) == len(buf)
        buf.add(make_batch(1, 2, step=step, seed=i), step)
        births += [step, step]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), k=st.integers(0, 50), seed=st.integers(0, 2**16), replacement=st.booleans())
def test_without_replacement_never_repeats(n, k, seed, replacement):
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, replacement=replacement), seed=seed)
    buf.add(make_batch(n_groups=n, group_size=1, seed=seed, rewards=torch.rand(n)), 0)
    slots = buf.sampler.sample(buf.storage, k, buf.rng)
    if replacement:
        assert len(slots) == k
    else:
        assert len(slots) == min(k, n) and len(set(slots.tolist())) == len(slots)


def _buffer_with_advantages(adv, priority="abs_advantage", alpha=0.5, replacement=False, seed=0):
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, priority=priority, alpha=alpha, replacement=replacement), seed=seed)
    b = make_batch(n_groups=len(adv), group_size=1, seed=0)
    b.advantages = torch.tensor(adv, dtype=torch.float32)
    b.group_std = torch.tensor([abs(a) for a in adv], dtype=torch.float32)
    buf.add(b, 0)
    return buf


@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_sampling_frequencies_follow_priorities(replacement, alpha):
    """Single draws (without replacement the first draw of a sequence) follow (|A|+eps)^alpha: chi-square."""
    from scipy.stats import chisquare

    adv = [0.0, 0.1, -0.5, 1.0, -2.0, 3.0]
    buf = _buffer_with_advantages(adv, alpha=alpha, replacement=replacement, seed=7)
    N = 20_000
    counts = np.zeros(len(adv))
    slots = buf.storage.valid_slots()
    for _ in range(N):
        s = buf.sampler.sample(buf.storage, 1, buf.rng)[0]
        counts[np.flatnonzero(slots == s)[0]] += 1
    p = (np.abs(adv) + 1e-6) ** alpha
    p /= p.sum()
    assert counts[0] < 0.01 * N  # |A| = 0 is nearly never drawn at alpha > 0...
    assert chisquare(counts, p * N).pvalue > 1e-3
    # a wrong hypothesis (uniform) is rejected decisively: the test has power
    assert chisquare(counts, np.full(len(adv), N / len(adv))).pvalue < 1e-6


def test_without_replacement_is_sequential_proportional():
    """Gumbel-top-k order = successive draws proportional to weight among the rest: check P(second | first)."""
    adv = [1.0, 2.0, 3.0]
    buf = _buffer_with_advantages(adv, alpha=1.0, seed=3)
    w = np.array(adv) + 1e-6
    pairs = {}
    N = 30_000
    for _ in range(N):
        a, b = buf.sampler.sample(buf.storage, 2, buf.rng).tolist()
        pairs[(a, b)] = pairs.get((a, b), 0) + 1
    slots = buf.storage.valid_slots().tolist()
    for (a, b), c in pairs.items():
        ia, ib = slots.index(a), slots.index(b)
        p = w[ia] / w.sum() * w[ib] / (w.sum() - w[ia])
        assert abs(c / N - p) < 4 * np.sqrt(p * (1 - p) / N) + 1e-3


def test_uniform_and_group_std_behave_as_named():
    from scipy.stats import chisquare

    adv = [0.0, 0.1, -0.5, 1.0]
    buf = _buffer_with_advantages(adv, priority="uniform", seed=1)
    counts = np.bincount([int(buf.sampler.sample(buf.storage, 1, buf.rng)[0]) for _ in range(8000)], minlength=4)
    assert chisquare(counts).pvalue > 1e-3
    # group_std: rows of one group share a weight whatever their |A|
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, priority="group_std"), seed=0)
    b = make_batch(2, 4, rewards=torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0]))
    buf.add(b, 0)
    w = buf.storage.col("weight")[buf.storage.valid_slots()]
    assert np.allclose(w[:4], w[0]) and np.allclose(w[4:], w[4]) and w[4] > w[0]  # std 0.577 > 0.5


def test_group_granularity_draws_whole_groups():
    buf = ReplayBuffer(ReplayConfig.uniform_pool(warmup_steps=0), seed=0)
    buf.add(make_batch(n_groups=6, group_size=4, seed=2), 0)
    out = buf.sample(6, 1)
    assert len(out) == 8  # two whole groups reach 6 rows
    ids, counts = out.group_ids.unique(return_counts=True)
    assert len(ids) == 2 and (counts == 4).all()


@pytest.mark.parametrize("granularity", ["rollout", "group"])
def test_capacity_backstop_oldest_first(granularity):
    buf = ReplayBuffer(ReplayConfig(capacity=10, tau_max=None, granularity=granularity), seed=0)
    for t in range(5):
        buf.add(make_batch(1, 4, step=t, seed=t), t)
        assert len(buf) <= 10
    births = buf.storage.col("birth_step")[buf.storage.valid_slots()]
    assert births.min() >= 2  # the oldest went first
    if granularity == "group":
        assert len(buf) == 8  # whole groups only


def _run(buf, steps, start=0):
    draws = []
    for t in range(start, start + steps):
        out = buf.sample(6, t)
        draws.append((out.advantages.tolist(), out.birth_step.tolist(), out.completion_ids.tolist()))
        buf.add(make_batch(2, 4, step=t, seed=100 + t), t)
    return draws


@pytest.mark.parametrize("preset", ["paper", "sigma_pool"])
def test_state_dict_round_trip_draws_identically(preset, tmp_path):
    cfg = ReplayConfig.from_preset(preset, warmup_steps=1, tau_max=3)
    a = ReplayBuffer(cfg, seed=11)
    _run(a, 6)
    state = a.state_dict()
    a.save(tmp_path / "buf")
    b = ReplayBuffer(cfg, seed=999)
    b.load_state_dict(state)
    c = ReplayBuffer.load(tmp_path / "buf")
    ref = _run(a, 6, start=6)
    assert _run(b, 6, start=6) == ref
    assert _run(c, 6, start=6) == ref


def test_load_rejects_other_config():
    a = ReplayBuffer(ReplayConfig(tau_max=3))
    with pytest.raises(ValueError, match="saved with config"):
        ReplayBuffer(ReplayConfig(tau_max=4)).load_state_dict(a.state_dict())


def test_stats_report_memory():
    buf = ReplayBuffer(seed=0)
    buf.add(make_batch(4, 4), 0)
    s = buf.stats(3)
    assert s["buffer/size"] == 16 and s["buffer/mean_age"] == 3 and s["buffer/bytes"] > 0
    assert s["buffer/age_hist"] == [0, 0, 0, 16]
