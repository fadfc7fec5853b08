"""`ReplaySession.defer`'s handle (`Deferred`): the insertion numbers the rows get, log-probs written after the
defer, what a flush inserted, and the waiting rows' saved state."""
import math

import numpy as np
import pytest
import torch

from grpo_replay import ReplayConfig
from grpo_replay.deferred import Deferred
from grpo_replay.session import ReplaySession
from helpers import make_batch

CFG = ReplayConfig(warmup_steps=0, tau_max=None)


def _stored(session: ReplaySession) -> dict[int, float]:
    """Insertion number -> advantage of every stored row."""
    st = session.buffer.storage
    slots = st.valid_slots()
    return dict(zip(st.col("seq")[slots].tolist(), st.col("advantage")[slots].tolist()))


def test_handle_numbers_are_the_ones_the_buffer_stores_and_draws():
    s = ReplaySession(CFG, seed=0)
    s.buffer.add(make_batch(1, 4, step=0, seed=9))  # numbers 0..3
    a, b = make_batch(2, 4, step=1, seed=0), make_batch(1, 4, step=1, seed=1)
    ha, hb = s.defer(a), s.defer(b)
    assert isinstance(ha, Deferred) and ha.seqs.tolist() == list(range(4, 12)) and hb.seqs.tolist() == [12, 13, 14, 15]
    assert s.buffer.next_seq == 16 and len(s.buffer) == 4  # handed out, not stored yet
    assert s.flush() == 12 and s.flushed == [ha, hb] and ha.inserted.tolist() == ha.seqs.tolist()
    stored = _stored(s)
    for h, rows in ((ha, a), (hb, b)):
        assert [stored[q] for q in h.seqs.tolist()] == pytest.approx(rows.advantages.tolist())
    drawn = s.buffer.sample(6, 2)
    for q, adv in zip(drawn.buffer_seq.tolist(), drawn.advantages.tolist()):
        assert stored[q] == pytest.approx(adv)
    assert s.buffer.add(make_batch(1, 4, step=2, seed=3)) == 4 and s.buffer.keys()[0].max() == 19


def test_numbers_handed_out_are_never_taken_by_a_direct_add():
    s = ReplaySession(CFG)
    h = s.defer(make_batch(1, 4, step=0, seed=0))
    s.buffer.add(make_batch(1, 4, step=0, seed=1))  # an add beside the session numbers past the waiting rows
    assert sorted(s.buffer.keys()[0].tolist()) == [4, 5, 6, 7]
    assert s.flush() == 4 and sorted(s.buffer.keys()[0].tolist()) == list(range(8)) and h.n_inserted == 4


def test_log_probs_filled_after_the_defer_and_a_flush_refuses_rows_still_missing_them():
    s = ReplaySession(CFG)
    rows = make_batch(2, 4, step=0, seed=0)
    want = rows.behaviour_logps.clone()
    rows.behaviour_logps.zero_()  # placeholders until the update measures them
    other = s.defer(make_batch(1, 4, step=0, seed=1))
    h = s.defer(rows, missing_logps=True)
    assert h.missing_rows().tolist() == list(range(8))
    with pytest.raises(ValueError, match=r"behaviour_logps of rows \[0, 1, 2, 3, 4\] \(8\) of deferred batch 1 of "
                                         r"the 2 waiting.*Deferred.fill.*nothing was inserted"):
        s.flush()
    assert len(s.buffer) == 0 and s.waiting() == [other, h] and other.n_inserted == 0 and s.take_inserted() == 0
    wide = torch.cat([want, torch.full((8, 3), 7.0)], dim=1)  # an engine's forward may be wider
    h.fill(torch.arange(0, 8, 2), wide[0::2])
    assert h.missing_rows().tolist() == [1, 3, 5, 7]
    with pytest.raises(ValueError, match=r"rows \[1, 3, 5, 7\] \(4\) of deferred batch 1"):
        s.flush()
    h.fill(h.missing.clone(), want[1::2])  # a bool index works too
    with pytest.raises(ValueError, match=r"Deferred.fill: logps has shape \(1, 2\)"):
        h.fill([0], want[:1, :2])
    assert s.flush() == 12 and not h.missing.any()
    stored = s.buffer.gather(np.flatnonzero(np.isin(s.buffer.keys()[0], h.seqs)))
    m = rows.completion_mask.bool()
    assert torch.equal(stored.behaviour_logps[:, : want.shape[1]][m], want[m])
    with pytest.raises(ValueError, match=r"has been flushed"):
        h.fill([0], want[:1])


def test_a_failing_flush_changes_nothing_and_the_next_one_uses_the_same_numbers():
    s = ReplaySession(CFG)
    a, b = make_batch(1, 4, step=0, seed=0), make_batch(1, 4, step=0, seed=1)
    ha, hb = s.defer(a), s.defer(b)
    b.rewards[2] = math.nan  # changed after the defer
    before = (s.buffer.next_seq, list(s.pending), s.buffer.totals.to_dict())
    with pytest.raises(ValueError, match=r"rewards must be finite.*deferred batch 1 of the 2 waiting"):
        s.flush()
    assert (s.buffer.next_seq, list(s.pending), s.buffer.totals.to_dict()) == before and len(s.buffer) == 0
    assert ha.n_inserted == hb.n_inserted == 0 and ha.waiting == hb.waiting == 4 and s.flushed == []
    b.rewards[2] = 0.0
    assert s.flush() == 8 and sorted(s.buffer.keys()[0].tolist()) == ha.seqs.tolist() + hb.seqs.tolist()


def test_rows_with_nonfinite_log_probs_leave_their_numbers_unused():
    s = ReplaySession(CFG)
    rows = make_batch(1, 4, step=0, seed=0)
    rows.behaviour_logps[1, 0] = -math.inf
    h = s.defer(rows)
    assert s.flush() == 3 and s.take_skipped_nonfinite() == 1
    assert h.skipped.tolist() == [1] and h.inserted.tolist() == [0, 2, 3]
    assert sorted(s.buffer.keys()[0].tolist()) == [0, 2, 3]  # a gap at 1
    assert s.defer(make_batch(1, 4, step=1, seed=1)).seqs.tolist() == [4, 5, 6, 7]


def test_several_batches_enter_in_birth_order_each_row_with_its_number():
    """Rows enter in birth order (stable: defer order within a birth), so the slots fill as before; each keeps the
    number its handle gave it, whatever its place in the one add."""
    s = ReplaySession(CFG)
    late, early = make_batch(1, 4, step=2, seed=0), make_batch(1, 4, step=1, seed=1)
    late.birth_step = torch.tensor([2, 1, 2, 1])
    hl, he = s.defer(late), s.defer(early)
    assert s.flush() == 8
    seqs, _ = s.buffer.keys()  # slot order = the add's order on a new buffer
    births = s.buffer.storage.col("birth_step")[s.buffer.storage.valid_slots()]
    assert births.tolist() == [1] * 6 + [2] * 2
    assert seqs.tolist() == [hl.seqs[1], hl.seqs[3], *he.seqs.tolist(), hl.seqs[0], hl.seqs[2]]
    stored = _stored(s)
    assert [stored[q] for q in hl.seqs.tolist()] == pytest.approx(late.advantages.tolist())


def test_partly_due_batch_flushes_in_two_parts():
    s = ReplaySession(CFG)
    rows = make_batch(1, 4, step=0, seed=0)
    rows.birth_step = torch.tensor([0, 1, 0, 1])
    h = s.defer(rows)
    assert s.flush(before=1) == 2 and h.inserted.tolist() == [0, 2] and h.waiting == 2 and s.waiting() == [h]
    assert s.flush() == 2 and h.inserted.tolist() == [0, 2, 1, 3] and h.waiting == 0 and s.waiting() == []


def test_waiting_rows_keep_their_numbers_and_missing_log_probs_through_pending_state(tmp_path):
    s = ReplaySession(CFG)
    s.buffer.add(make_batch(1, 4, step=0, seed=5))
    a = make_batch(1, 4, step=0, seed=0)
    a.birth_step = torch.tensor([0, 1, 0, 1])
    ha = s.defer(a, prompt_keys=[5, 6, 7, 8])
    hb = s.defer(make_batch(1, 4, step=1, seed=1), missing_logps=torch.tensor([False, True, False, False]))
    assert s.flush(before=1) == 2  # a's rows born at 0
    state = s.pending_state()
    s.save(tmp_path / "buf")
    restored = ReplaySession(CFG)
    restored.load(tmp_path / "buf")
    handles = restored.load_pending(state)
    assert [h.seqs.tolist() for h in handles] == [ha.seqs[[1, 3]].tolist(), hb.seqs.tolist()]
    assert handles[1].missing_rows().tolist() == [1] and restored.buffer.next_seq == s.buffer.next_seq
    with pytest.raises(ValueError, match=r"rows \[1\] \(1\) of deferred batch 1 of the 2 waiting"):
        restored.flush()
    for session, h in ((s, hb), (restored, handles[1])):
        h.fill([1], h.rows.behaviour_logps[1:2] * 0 - 0.5)
        assert session.flush() == 6
    assert sorted(dict(zip(*restored.buffer.keys())).items()) == sorted(dict(zip(*s.buffer.keys())).items())
    old = [{k: v for k, v in e.items() if k != "insertion_numbers"} for e in state]  # saved before numbers were kept
    fresh = ReplaySession(CFG)
    assert [h.seqs.tolist() for h in fresh.load_pending(old)] == [[0, 1], [2, 3, 4, 5]]


def test_missing_logps_must_be_one_bool_or_one_per_row():
    s = ReplaySession(CFG)
    with pytest.raises(ValueError, match=r"missing_logps has shape \(3,\).*allowed: a bool, or 4 bools"):
        s.defer(make_batch(1, 4, step=0, seed=0), missing_logps=torch.zeros(3, dtype=torch.bool))
    empty = make_batch(1, 4, step=0, seed=0).select(torch.arange(0))
    assert not s.pending and s.defer(empty).seqs.tolist() == [] and not s.pending
