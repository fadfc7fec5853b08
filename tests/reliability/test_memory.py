"""Buffer memory: reported in the metrics, bounded by replay.capacity."""
import numpy as np
from helpers import make_batch, read_jsonl

from grpo_replay import ReplayBuffer
from grpo_replay.config import ReplayConfig
from grpo_replay.storage import COLUMNS


def test_buffer_bytes_in_the_metrics(reference_run):
    rows = read_jsonl(reference_run / "metrics.jsonl")
    assert all(isinstance(r["buffer/bytes"], int) and r["buffer/bytes"] > 0 for r in rows)
    assert all("buffer/size" in r and "buffer/evicted_capacity" in r for r in rows)
    assert rows[-1]["buffer/size"] > 0


def test_buffer_bytes_bounded_by_capacity():
    """Insert 40x the capacity: the buffer keeps `capacity` rows, allocated slots never exceed
    2 * (capacity + one batch), and its bytes stay under, per allocated slot, the columns, the sum tree
    (2 float64 nodes a slot, rounded up to a power of two) and one padded arena row as wide as the
    longest prompt and completion."""
    capacity, n_groups, group_size, max_p, max_c = 64, 4, 4, 9, 13
    batch_rows = n_groups * group_size
    buf = ReplayBuffer(ReplayConfig(capacity=capacity, tau_max=None), seed=0)
    storage = buf.storage
    storage.__init__(initial_slots=8)  # start small so that growth is exercised
    col_bytes = sum(np.dtype(d).itemsize for d in COLUMNS.values()) + 1  # + the valid flag
    # prompt ids int32 + completion ids int32 + log-probs float32 + mask bool, per token
    row_bytes = 4 * max_p + (4 + 4 + 1) * max_c
    peak = []
    for step in range(40 * capacity // batch_rows):
        buf.add(make_batch(n_groups, group_size, step=step, seed=step, max_prompt=max_p, max_completion=max_c), step)
        assert len(buf) <= capacity
        b = buf.stats(step + 1)["buffer/bytes"]
        slots = len(storage.valid)
        assert slots <= 2 * (capacity + batch_rows)
        tree_bytes = 2 * 8 * (1 << (slots - 1).bit_length())
        assert b <= slots * (col_bytes + row_bytes) + tree_bytes
        peak.append(b)
    assert len(buf) == capacity and buf.total_evicted_capacity == 40 * capacity - capacity
    assert max(peak[len(peak) // 2 :]) <= max(peak[: len(peak) // 2])  # no growth once full


def test_capacity_none_grows_with_the_rows():
    """Nothing is evicted, so the bytes grow once the rows outgrow the slots allocated up front."""
    buf = ReplayBuffer(ReplayConfig(capacity=None, tau_max=None), seed=0)
    initial_slots = len(buf.storage.valid)
    sizes = []
    for step in range(6):
        buf.add(make_batch(n_groups=initial_slots // 16, step=step, seed=step), step)
        sizes.append(buf.stats(step + 1)["buffer/bytes"])
    assert len(buf) == 6 * (initial_slots // 4) > initial_slots
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
