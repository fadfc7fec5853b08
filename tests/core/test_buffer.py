import math
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


def test_state_keeps_named_totals_and_old_list_totals_still_load():
    a = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=1, capacity=6), seed=0)
    for t in range(4):
        a.add(make_batch(1, 4, step=t, seed=t), t)
        a.sample(2, t + 1)
    state = a.state_dict()
    assert state["totals"] == {"added": a.total_added, "evicted_age": a.total_evicted_age,
                               "evicted_capacity": a.total_evicted_capacity, "evicted_uses": 0, "evicted_drift": 0}
    old = {**state, "version": 2, "totals": [a.total_added, a.total_evicted_age, a.total_evicted_capacity]}
    b = ReplayBuffer(a.config)
    b.load_state_dict(old)
    assert (b.total_added, b.total_evicted_age, b.total_evicted_capacity) == (16, a.total_evicted_age, a.total_evicted_capacity)
    with pytest.raises(ValueError, match="totals"):
        ReplayBuffer(a.config).load_state_dict({**state, "totals": {"added": 16}})



def _same(a, b) -> bool:
    """Deep equality of two state_dicts (nested dicts, lists, numpy arrays, scalars)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b)) and np.asarray(a).dtype == np.asarray(b).dtype
    return a == b


def _refused_adds():
    """(what, batch, step, prompt_keys) of adds that must raise."""
    b = lambda **kw: make_batch(2, 3, step=4, seed=7, **kw)  # noqa: E731
    two = b()
    two.completion_mask = two.completion_mask * 2
    float_ids = b()
    float_ids.completion_ids = float_ids.completion_ids.float() + 0.5
    return [
        ("prompt_keys too short", b(), 4, [1, 2, 3]),
        ("prompt_keys fractional", b(), 4, [0.5] * 6),
        ("ref_logps where the stored rows have none", b(with_ref=True), 4, None),
        ("completion mask of 2", two, 4, None),
        ("float token ids", float_ids, 4, None),
        ("fractional step", b(), 4.5, None),
    ]


@pytest.mark.parametrize("what,batch,step,keys", _refused_adds(), ids=[r[0] for r in _refused_adds()])
def test_a_failed_add_changes_nothing(what, batch, step, keys, tmp_path):
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, capacity=40), seed=3)
    for t in range(3):
        buf.sample(4, t)
        buf.add(make_batch(2, 4, step=t, seed=t), t, prompt_keys=list(range(8)))
    before = buf.state_dict()
    with pytest.raises(ValueError):
        buf.add(batch, step, prompt_keys=keys)
    assert _same(buf.state_dict(), before)
    buf.save(tmp_path / "buf")
    loaded = ReplayBuffer.load(tmp_path / "buf")
    assert _same(loaded.state_dict(), before)
    assert torch.equal(loaded.sample(5, 4).advantages, buf.sample(5, 4).advantages)


def test_no_draw_at_a_step_before_a_stored_birth():
    """add at 5, then at 3, then a draw at 4 would replay rows of age -1: refused. Late rows are fine."""
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None), seed=0)
    buf.add(make_batch(1, 4, step=5, seed=0), 5)
    buf.add(make_batch(1, 4, step=3, seed=1), 3)  # a late insert keeps its birth step
    with pytest.raises(ValueError, match="step 4 is before the birth step 5"):
        buf.sample(4, 4)
    with pytest.raises(ValueError, match="birth step 5"):
        buf.evict(4)
    assert len(buf) == 8
    out = buf.sample(8, 6)
    assert sorted(out.birth_step.tolist()) == [3] * 4 + [5] * 4 and bool((out.age(6) >= 0).all())
    buf.add(make_batch(1, 4, step=2, seed=2), 2)  # rows arriving after a draw at a later step
    assert bool((buf.sample(12, 6).age(6) >= 0).all())
    with pytest.raises(ValueError, match="step=2.5 is invalid"):
        buf.sample(4, 2.5)
    for n in (2.5, True, -1, "4", None):  # numpy's TypeError, one row for True, nothing for -1: each named now
        with pytest.raises(ValueError, match=rf"ReplayBuffer.sample: n_rows={n!r} is invalid; allowed: an integer >= 0"):
            buf.sample(n, 6)
    assert len(buf) == 12 and len(buf.sample(np.int64(3), 6)) == 3


# --- options beyond the paper: age_decay, max_uses, evict_rows ------------------------------------------
def _two_ages(**cfg):
    """One row born at step 0 and one at step 5, equal |A| (so equal stored weights)."""
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None, replacement=True, **cfg), seed=0)
    r = torch.tensor([1.0, 0.0])
    buf.add(make_batch(1, 2, step=0, seed=0, rewards=r), 0)
    buf.add(make_batch(1, 2, step=5, seed=1, rewards=r), 5)
    return buf


def test_age_decay_multiplies_priority_by_exp_minus_age_over_decay():
    old_share = {}
    for decay in (None, 2.0):
        buf = _two_ages(age_decay=decay)
        births = buf.sample(4000, 5).birth_step
        old_share[decay] = float((births == 0).float().mean())
    assert abs(old_share[None] - 0.5) < 0.03  # equal weights without decay
    want = math.exp(-5 / 2.0) / (1 + math.exp(-5 / 2.0))  # 0.076: weight ratio exp(-(5 - 0) / 2)
    assert abs(old_share[2.0] - want) < 0.02


def test_age_decay_none_draws_exactly_what_the_paper_draws():
    a, b = _two_ages(), _two_ages(age_decay=None)
    assert a.sample(50, 6).birth_step.tolist() == b.sample(50, 6).birth_step.tolist()


def test_max_uses_evicts_a_row_after_that_many_replays():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None, max_uses=2), seed=0)
    buf.add(make_batch(2, 4, step=0), 0)
    first = buf.sample(8, 1)  # every row once
    assert len(first) == 8 and len(buf) == 8 and (buf.storage.col("uses")[buf.storage.valid] == 1).all()
    second = buf.sample(8, 2)  # every row its second time: all evicted after the draw, the batch intact
    assert len(second) == 8 and len(buf) == 0
    assert buf.total_evicted_uses == 8 and buf.stats(2)["buffer/evicted_uses"] == 8
    assert len(buf.sample(8, 3)) == 0


def test_max_uses_none_never_evicts_on_draw():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None), seed=0)
    buf.add(make_batch(2, 4, step=0), 0)
    for t in range(1, 6):
        buf.sample(8, t)
    assert len(buf) == 8 and "buffer/evicted_uses" not in buf.stats(6)


def test_replay_rows_carry_their_insertion_number_and_evict_rows_removes_exactly_them():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None, max_drift=0.1), seed=0)
    buf.add(make_batch(2, 4, step=0), 0)
    rep = buf.sample(3, 1)
    seqs = rep.buffer_seq
    assert seqs.shape == (3,) and len(set(seqs.tolist())) == 3
    assert buf.evict_rows(torch.cat([seqs[:2], torch.tensor([-1])])) == 2  # -1: a fresh row, passed over
    assert len(buf) == 6 and buf.total_evicted_drift == 2 and buf.stats(1)["buffer/evicted_drift"] == 2
    assert buf.evict_rows(seqs[:2]) == 0  # already gone
    left = set(buf.storage.col("seq")[buf.storage.valid].tolist())
    assert not left & set(seqs[:2].tolist()) and int(seqs[2]) in left
    buf.add(make_batch(1, 2, step=1, seed=5), 1)  # reuses the freed slots under new insertion numbers
    assert buf.evict_rows(seqs[:2]) == 0 and len(buf) == 8
    assert buf.total_added == len(buf) + buf.total_evicted_age + buf.total_evicted_capacity + buf.total_evicted_drift


def test_age_decay_weighs_whole_groups_too():
    buf = ReplayBuffer(ReplayConfig.uniform_pool(warmup_steps=0, tau_max=None, age_decay=0.01), seed=0)
    for t in range(4):
        buf.add(make_batch(2, 4, step=t, seed=t), t)
    drawn = buf.sample(8, 4)  # two whole groups: the youngest two, born at step 3
    assert len(drawn) == 8 and drawn.birth_step.tolist() == [3] * 8
    plain = ReplayBuffer(ReplayConfig.uniform_pool(warmup_steps=0, tau_max=None), seed=0)
    for t in range(4):
        plain.add(make_batch(2, 4, step=t, seed=t), t)
    assert any(plain.sample(8, 4).birth_step.tolist() != [3] * 8 for _ in range(5))


def test_the_totals_record_counts_every_row_once_and_is_what_the_state_saves():
    from grpo_replay.buffer_state import TOTALS, BufferTotals

    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=1, capacity=24, max_uses=1), seed=0)
    for step in range(6):
        buf.add(make_batch(2, 4, step=step, seed=step), step)
        buf.sample(4, step + 1)
    t = buf.totals
    assert isinstance(t, BufferTotals) and t.evicted_age and t.evicted_uses
    assert t.added == 48 == len(buf) + t.evicted()
    assert (buf.total_added, buf.total_evicted_age, buf.total_evicted_uses) == (t.added, t.evicted_age, t.evicted_uses)
    assert buf.state_dict()["totals"] == t.to_dict() and tuple(t.to_dict()) == TOTALS


def test_rows_added_without_prompt_keys_get_minus_one_also_in_refilled_slots(tmp_path):
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=0, capacity=None), seed=0)
    buf.add(make_batch(2, 4, step=0), 0)
    assert (buf.storage.col("prompt_key")[buf.storage.valid_slots()] == -1).all()
    buf.evict(1)
    buf.add(make_batch(2, 4, step=1, seed=1), 1, prompt_keys=list(range(10, 18)))
    first = buf.storage.valid_slots()
    assert buf.storage.col("prompt_key")[first].tolist() == list(range(10, 18))
    buf.evict(2)
    buf.add(make_batch(2, 4, step=2, seed=2), 2)  # refills the same slots, no keys given
    assert np.array_equal(buf.storage.valid_slots(), first)
    assert (buf.storage.col("prompt_key")[first] == -1).all()
    buf.save(tmp_path / "b")
    back = ReplayBuffer.load(tmp_path / "b")
    assert (back.storage.col("prompt_key")[back.storage.valid_slots()] == -1).all()
