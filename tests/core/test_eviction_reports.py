"""`ReplayBuffer.take_evicted`: the insertion numbers evicted by every path since the last call, none after a load."""
import numpy as np
import pytest

from grpo_replay import ReplayBuffer, ReplayConfig
from grpo_replay.session import ReplaySession
from helpers import make_batch


def _live(buf: ReplayBuffer) -> set[int]:
    return set(buf.keys()[0].tolist())


def _reported(buf: ReplayBuffer, act) -> tuple[list[int], set[int]]:
    """(the numbers `act` evicted as reported, as the stored rows' difference)."""
    before = _live(buf)
    act()
    return sorted(buf.take_evicted().tolist()), before - _live(buf)


def test_every_eviction_path_reports_exactly_the_rows_it_removed():
    cfg = ReplayConfig(warmup_steps=0, tau_max=2, capacity=12, max_uses=1, replacement=False)
    buf = ReplayBuffer(cfg, seed=0, report_evictions=True)
    assert buf.take_evicted().tolist() == []
    buf.add(make_batch(2, 4, step=0, seed=0))
    got, gone = _reported(buf, lambda: buf.add(make_batch(2, 4, step=1, seed=1)))  # capacity: 16 > 12
    assert got == sorted(gone) == [0, 1, 2, 3] and buf.total_evicted_capacity == 4
    got, gone = _reported(buf, lambda: buf.evict(3))  # age: born at 0 is older than 2 at step 3
    assert got == sorted(gone) == [4, 5, 6, 7] and buf.total_evicted_age == 4
    got, gone = _reported(buf, lambda: buf.sample(3, 3))  # max_uses 1: every drawn row leaves
    assert len(got) == 3 and got == sorted(gone) and buf.total_evicted_uses == 3
    left = sorted(_live(buf))
    got, gone = _reported(buf, lambda: buf.evict_rows([left[0], -1, 999]))  # explicit (drift): only stored ones
    assert got == sorted(gone) == [left[0]] and buf.total_evicted_drift == 1
    assert buf.take_evicted().tolist() == []  # each number reported once


def test_reports_add_up_between_calls_and_the_session_reports_its_drift_evictions():
    s = ReplaySession(ReplayConfig(warmup_steps=0, tau_max=1, max_drift=0.1), report_evictions=True)
    s.buffer.add(make_batch(1, 4, step=0, seed=0))
    s.buffer.add(make_batch(1, 4, step=1, seed=1))
    s.buffer.evict(2)  # rows born at 0
    s.evict_drifted(np.array([5]))
    assert s.buffer.take_evicted().tolist() == [0, 1, 2, 3, 5]


def test_a_loaded_buffer_reports_none_and_keeps_reporting(tmp_path):
    s = ReplaySession(ReplayConfig(warmup_steps=0, tau_max=0), report_evictions=True)
    s.buffer.add(make_batch(1, 4, step=0, seed=0))
    s.buffer.add(make_batch(1, 4, step=1, seed=1))
    s.buffer.evict(1)  # rows born at 0: reported, never read
    s.save(tmp_path / "buf")
    s.load(tmp_path / "buf")
    assert s.buffer.take_evicted().tolist() == []
    s.buffer.evict(2)
    assert s.buffer.take_evicted().tolist() == [4, 5, 6, 7]
    s.buffer.add(make_batch(1, 4, step=2, seed=2))
    state = s.buffer.state_dict()
    assert s.buffer.evict_rows([8]) == 1  # reported, never read, then the state before it is restored
    s.buffer.load_state_dict(state)
    assert s.buffer.take_evicted().tolist() == []


def test_reports_are_asked_for_at_construction():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=0))
    buf.add(make_batch(1, 4, step=0, seed=0))
    buf.evict(1)
    assert buf._evicted == []  # nothing kept for a buffer whose evictions nobody reads
    with pytest.raises(RuntimeError, match=r"take_evicted: this buffer was built without report_evictions=True"):
        buf.take_evicted()
