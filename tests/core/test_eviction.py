"""Evictions (eviction.py): age and capacity selection, straight on a storage and through the buffer."""
import numpy as np
import pytest

from grpo_replay import ReplayBuffer, ReplayConfig
from grpo_replay.eviction import AgeEviction, CapacityEviction, Eviction
from helpers import make_batch


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


def _stored(steps, group_size=2):
    buf = ReplayBuffer(ReplayConfig(tau_max=None, capacity=None), seed=0)
    for t in steps:
        buf.add(make_batch(1, group_size, step=t, seed=t), t)
    return buf.storage


def test_age_eviction_selects_rows_older_than_tau_max():
    storage = _stored([0, 1, 2, 3])
    births = storage.col("birth_step")
    assert sorted(births[AgeEviction(1).select(storage, 3)].tolist()) == [0, 0, 1, 1]
    assert len(AgeEviction(None).select(storage, 100)) == 0 and len(AgeEviction(1).select(storage, None)) == 0
    assert len(storage) == 8  # selecting removes nothing


def test_capacity_eviction_selects_the_oldest_insertions_or_their_whole_groups():
    storage = _stored([0, 1, 2], group_size=3)
    seq = storage.col("seq")
    assert sorted(seq[CapacityEviction(7).select(storage, None)].tolist()) == [0, 1]
    assert sorted(seq[CapacityEviction(7, whole_groups=True).select(storage, None)].tolist()) == [0, 1, 2]
    assert len(CapacityEviction(None).select(storage, None)) == 0


def test_evictions_share_the_part_contract():
    for part in (AgeEviction(3), CapacityEviction(10)):
        assert isinstance(part, Eviction) and part.state_dict() == {}
        part.load_state_dict({})
        with pytest.raises(ValueError, match="keeps no state"):
            part.load_state_dict({"x": 1})


def test_a_custom_eviction_replaces_the_age_eviction():
    class KeepNothing(Eviction):
        def select(self, storage, step):
            return storage.valid_slots()

    buf = ReplayBuffer(ReplayConfig(warmup_steps=0), age_eviction=KeepNothing())
    buf.add(make_batch(1, 4), 0)
    assert len(buf.sample(4, 1)) == 0 and buf.total_evicted_age == 4 and np.all(~buf.storage.valid)
