"""`ReplaySession`: the age bound, the rows waiting for the update window, the drift bound, the tally, save/load."""
import numpy as np
import pytest
import torch

from grpo_replay import ReplayBuffer, ReplayConfig, RolloutBatch, metric_names as mn
from grpo_replay.session import ReplaySession, effective_age_bound
from grpo_replay.tally import Tally
from helpers import make_batch


def _births(buf: ReplayBuffer) -> list[int]:
    st = buf.storage
    return sorted(st.col("birth_step")[st.valid_slots()].tolist())


def test_age_bound_is_the_smaller_of_tau_max_and_the_engines():
    assert effective_age_bound(10, None) == 10 and effective_age_bound(10, 3) == 3
    assert effective_age_bound(None, 4) == 4 and effective_age_bound(2, 4) == 2 and effective_age_bound(None, None) is None
    s = ReplaySession(ReplayConfig(tau_max=10, warmup_steps=0), engine_age_bound=2)
    assert s.age_bound == 2 and s.buffer.config.tau_max == 2 and s.config.tau_max == 10
    for t in range(4):
        s.buffer.add(make_batch(1, 4, step=t, seed=t))
    s.compose(make_batch(1, 4, step=4, seed=9), 4)  # evicts what is older than 2 at step 4
    assert _births(s.buffer) == [2] * 4 + [3] * 4
    assert ReplaySession(ReplayConfig()).buffer.config == ReplayConfig()  # no engine bound: the config as given


def test_add_takes_each_rows_birth_step_from_the_batch():
    """One add of rows of two birth steps stores each with its own, and draws what two adds would."""
    a, b = make_batch(2, 4, step=3, seed=1), make_batch(2, 4, step=5, seed=2)
    b.group_ids = b.group_ids + 2  # distinct groups, as one add needs
    cfg = ReplayConfig(warmup_steps=0, tau_max=None)
    one, two = ReplayBuffer(cfg, seed=7), ReplayBuffer(cfg, seed=7)
    assert one.add(RolloutBatch.concat([a, b])) == 16 and one.last_step == 5
    two.add(a, 3)
    two.add(b, 5)
    assert _births(one) == _births(two) == [3] * 8 + [5] * 8
    x, y = one.sample(6, 6), two.sample(6, 6)
    assert torch.equal(x.buffer_seq, y.buffer_seq) and torch.equal(x.birth_step, y.birth_step)
    assert ReplayBuffer(cfg).add(a, step=9) == 8  # an explicit step still stamps every row


def test_deferred_rows_enter_at_the_flush_with_their_own_births():
    s = ReplaySession(ReplayConfig(warmup_steps=0, tau_max=None), seed=0)
    s.defer(make_batch(2, 4, step=0, seed=0))  # groups numbered from 0 in each batch
    s.defer(make_batch(2, 4, step=1, seed=1))
    assert len(s.buffer) == 0
    assert s.flush(before=1) == 8 and _births(s.buffer) == [0] * 8  # born at 1: still waiting
    assert s.flush() == 8 and _births(s.buffer) == [0] * 8 + [1] * 8 and not s.pending
    assert len(np.unique(s.buffer.storage.col("group_key")[s.buffer.storage.valid_slots()])) == 4
    assert s.take_inserted() == 16 and s.take_inserted() == 0


def test_flush_of_several_batches_is_one_add_in_birth_order():
    """Rows of mixed births from several deferred batches: one add, stably sorted by birth; with global group ids
    (an engine numbering groups over the run) one group deferred in two batches stays one stored group."""
    a, b = make_batch(2, 4, step=2, seed=0), make_batch(2, 4, step=1, seed=1)
    a.birth_step = torch.tensor([2] * 4 + [1] * 4)
    s = ReplaySession(ReplayConfig(warmup_steps=0, tau_max=None), global_groups=True)
    adds = []
    real = s.buffer.add
    s.buffer.add = lambda batch, **kw: adds.append(batch.birth_step.tolist()) or real(batch, **kw)
    s.defer(a, prompt_keys=list(range(8)))
    s.defer(b)
    assert s.flush() == 16
    assert adds == [[1] * 12 + [2] * 4]
    st = s.buffer.storage
    keys = st.col("group_key")[st.valid_slots()]
    assert len(np.unique(keys)) == 2  # group ids 0 and 1 in both batches: global, so two groups
    pk = dict(zip(*s.buffer.keys()))
    assert sorted(pk.values()) == [-1] * 8 + list(range(8))


def test_flush_counts_the_rows_it_inserts_of_each_deferred_batch():
    """Rows with a NaN / inf log-prob stay out of the one add and are counted once, over the batches and per batch
    given to defer (rows of mixed births: a batch only partly due counts in each flush that takes part of it)."""
    a, b, c = make_batch(2, 4, step=1, seed=0), make_batch(2, 4, step=0, seed=1), make_batch(1, 4, step=0, seed=2)
    a.birth_step = torch.tensor([1] * 4 + [2] * 4)
    a.behaviour_logps[0, 0] = float("nan")  # due at the first flush
    a.behaviour_logps[5, 0] = float("-inf")  # due at the second
    b.behaviour_logps[7, 0] = float("inf")
    s = ReplaySession(ReplayConfig(warmup_steps=0, tau_max=None))
    ha, hb, hc = (s.defer(rows) for rows in (a, b, c))
    assert s.flush(before=2) == 3 + 7 + 4 and s.take_skipped_nonfinite() == 2
    assert [h.n_inserted for h in (ha, hb, hc)] == [3, 7, 4] and s.flushed == [ha, hb, hc]
    assert ha.skipped.tolist() == [ha.seqs[0]] and hb.skipped.tolist() == [hb.seqs[7]] and ha.waiting == 4
    assert s.flush() == 3 and s.take_skipped_nonfinite() == 1 and s.flushed == [ha]
    assert [h.n_inserted for h in (ha, hb, hc)] == [6, 7, 4] and ha.skipped.tolist() == ha.seqs[[0, 5]].tolist()
    assert s.flush() == 0 and s.flushed == [] and ha.waiting == 0


def test_drift_bound_evicts_replayed_rows_above_it_and_never_fresh_ones():
    s = ReplaySession(ReplayConfig(warmup_steps=0, tau_max=None, max_drift=0.1), seed=0)
    s.buffer.add(make_batch(2, 4, step=0, seed=0))
    fresh = make_batch(1, 4, step=1, seed=1)
    batch = s.compose(fresh, 1).batch
    n_rep = int(batch.is_replay.sum())
    assert n_rep == 2
    drift = torch.full((len(batch),), 0.5)  # every row above the bound, fresh ones included
    drift[len(fresh)] = 0.05  # one replayed row below it
    dropped = s.drifted(batch, drift)
    assert dropped.tolist() == [False] * len(fresh) + [False, True]
    assert s.evict_drifted(batch.buffer_seq[dropped]) == 1 and len(s.buffer) == 7 and s.buffer.total_evicted_drift == 1
    m = s.tally(batch, 1, drift=drift, dropped=dropped).metrics()
    assert m[mn.REPLAY_DRIFT_DROPPED] == 1 and m[mn.REPLAY_DRIFT_MAX] == 0.5
    assert abs(m[mn.REPLAY_DRIFT_MEAN] - 0.275) < 1e-6
    # The counts, share, |A| and age are of the rows that reached the loss: the dropped row is not among them.
    kept = batch.is_replay & ~dropped
    assert m[mn.REPLAY_COUNT] == 1 and m[mn.FRESH_COUNT] == len(fresh)
    assert m[mn.REPLAY_SHARE] == pytest.approx(1 / (len(fresh) + 1))
    assert m[mn.REPLAY_ABS_ADV] == pytest.approx(float(batch.advantages[kept].abs().mean()))
    assert not ReplaySession(ReplayConfig()).drifted(batch, drift).any()  # no bound: nothing dropped


def test_tally_reads_as_the_means_over_rows_and_merges_over_processes():
    s = ReplaySession(ReplayConfig(warmup_steps=0, tau_max=None), seed=0)
    s.buffer.add(make_batch(3, 4, step=0, seed=0))
    s.buffer.add(make_batch(3, 4, step=2, seed=1))
    batch = s.compose(make_batch(2, 4, step=5, seed=2), 5).batch
    rep = batch.is_replay
    t = s.tally(batch, 5, groups=4, zero_variance_groups=1)
    m = t.metrics()
    assert m[mn.REPLAY_COUNT] == int(rep.sum()) == 4 and m[mn.FRESH_COUNT] == 8
    assert m[mn.REPLAY_SHARE] == float(rep.float().mean())
    assert m[mn.FRESH_ABS_ADV] == float(batch.advantages[~rep].abs().mean())
    assert m[mn.REPLAY_ABS_ADV] == float(batch.advantages[rep].abs().mean())
    ages = batch.age(5)[rep]
    assert m[mn.REPLAY_AGE_MEAN] == float(ages.float().mean()) and m[mn.REPLAY_AGE_MAX] == int(ages.max())
    assert m[mn.ZERO_VARIANCE_SHARE] == 0.25
    # two processes: sums add, maxima are the larger
    other = Tally.of(batch.select(torch.arange(8, 12)), 9)  # replay rows only, older at step 9
    both = Tally.merge({k: [t.flat().get(k, 0.0), other.flat().get(k, 0.0)] for k in t.flat().keys() | other.flat().keys()})
    mm = both.metrics()
    assert mm[mn.REPLAY_COUNT] == 8 and mm[mn.FRESH_COUNT] == 8
    assert mm[mn.REPLAY_AGE_MAX] == int(ages.max()) + 4


def test_save_and_load_round_trip_the_buffer(tmp_path):
    cfg = ReplayConfig(warmup_steps=0, tau_max=5)
    s = ReplaySession(cfg, seed=3, engine_age_bound=3)
    s.buffer.add(make_batch(2, 4, step=0, seed=0))
    s.save(tmp_path / "buf")
    r = ReplaySession(cfg, seed=99, engine_age_bound=3)
    r.defer(make_batch(1, 4, step=0, seed=1))
    r.load(tmp_path / "buf")
    assert not r.pending and len(r.buffer) == 8 and r.buffer.config.tau_max == 3
    x, y = s.buffer.sample(4, 1), r.buffer.sample(4, 1)
    assert torch.equal(x.buffer_seq, y.buffer_seq)


def test_waiting_rows_round_trip_through_pending_state():
    """An engine that checkpoints while rows wait restores them (`pending_state` / `load_pending`): the restored
    session inserts the same rows with the same prompt keys."""
    cfg = ReplayConfig(warmup_steps=0, tau_max=None)
    s = ReplaySession(cfg)
    s.defer(make_batch(1, 4, step=0, seed=0), prompt_keys=[5, 6, 7, 8])
    s.defer(make_batch(1, 4, step=1, seed=1))
    restored = ReplaySession(cfg)
    restored.load_pending(s.pending_state())
    assert restored.flush(before=1) == s.flush(before=1) == 4
    assert restored.flush() == s.flush() == 4
    assert sorted(dict(zip(*restored.buffer.keys())).values()) == sorted(dict(zip(*s.buffer.keys())).values())


def test_defer_refuses_a_batch_the_buffer_would_refuse():
    """Behaviour log-probs narrower than the completions are refused at defer, as `ReplayBuffer.add` refuses them,
    not padded with 0.0 (probability 1) by a later flush over several batches."""
    s = ReplaySession(ReplayConfig(warmup_steps=0, tau_max=None))
    good, narrow = make_batch(2, 4, step=0, seed=0), make_batch(2, 4, step=0, seed=1, max_completion=7)
    narrow.behaviour_logps = narrow.behaviour_logps[:, :-1]
    with pytest.raises(ValueError, match=r"ReplayBuffer.add: behaviour_logps has shape") as added:
        ReplayBuffer(ReplayConfig()).add(narrow)
    s.defer(good)
    with pytest.raises(ValueError, match=r"^ReplaySession.defer: behaviour_logps has shape") as deferred:
        s.defer(narrow)
    assert str(deferred.value).split(": ", 1)[1] == str(added.value).split(": ", 1)[1]
    with pytest.raises(ValueError, match=r"ReplaySession.defer: prompt_keys has shape \(3,\)"):
        s.defer(make_batch(2, 4, step=0, seed=2), prompt_keys=[0, 1, 2])
    assert len(s.pending) == 1 and s.flush() == 8  # only the good batch waited


def test_a_flush_that_raises_keeps_the_waiting_rows_and_names_the_deferred_batch():
    """A batch changed after defer (its log-probs filled in wrongly, a NaN advantage) fails the flush: the error names
    that batch as the caller gave it (its place in defer order, its own row numbers), nothing is inserted, and every
    waiting row, the valid batches' too, is kept for the next flush."""
    s = ReplaySession(ReplayConfig(warmup_steps=0, tau_max=None))
    a, b, c = make_batch(2, 4, step=0, seed=0), make_batch(2, 4, step=0, seed=1), make_batch(1, 4, step=1, seed=2)
    ha, hb, hc = (s.defer(rows) for rows in (a, b, c))
    b.advantages[6] = float("nan")  # row 6 of b; row 14 of the merged batch
    pending = list(s.pending)
    with pytest.raises(ValueError, match=r"advantages must be finite; rows \[6\] .*deferred batch 1 of the 3 waiting"):
        s.flush()
    assert s.pending == pending and len(s.buffer) == 0 and s.take_inserted() == 0
    c.behaviour_logps = c.behaviour_logps[:, :-1]  # only c is not due before step 1: b's error comes first
    with pytest.raises(ValueError, match=r"deferred batch 1 of the 3 waiting"):
        s.flush(before=1)
    b.advantages[6] = 0.5
    assert s.flush(before=1) == 16 and ha.n_inserted == 8 and hb.n_inserted == 8
    with pytest.raises(ValueError, match=r"behaviour_logps has shape .*deferred batch 0 of the 1 waiting"):
        s.flush()
    assert len(s.pending) == 1 and len(s.buffer) == 16
