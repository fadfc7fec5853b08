"""ComposedBatch: the segments of a composed batch behave as their padded concatenation, without copying it."""
import dataclasses

import pytest
import torch

from grpo_replay import ComposedBatch, ReplayBuffer, ReplayConfig, RolloutBatch, compose_batch
from helpers import make_batch


def _same(a: RolloutBatch, b: RolloutBatch) -> None:
    for f in dataclasses.fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (x is None) == (y is None), f.name
        if x is not None:
            assert x.shape == y.shape and torch.equal(x, y.to(x.dtype)), f.name


def _parts(with_ref=False):
    return [make_batch(3, 4, step=5, seed=1, max_completion=9, with_ref=with_ref),
            make_batch(2, 4, step=2, seed=2, max_prompt=8, max_completion=4, with_ref=with_ref)]


@pytest.mark.parametrize("with_ref", [False, True])
def test_reads_as_the_padded_concatenation(with_ref):
    parts = _parts(with_ref)
    c, dense = ComposedBatch(parts), RolloutBatch.concat(parts)
    assert isinstance(c, RolloutBatch) and len(c) == len(dense) == 20
    _same(c, dense)
    assert torch.equal(c.completion_lengths(), dense.completion_lengths())
    assert torch.equal(c.prompt_lengths(), dense.prompt_lengths())
    assert c.completion_width() == dense.completion_width()


def test_row_fields_and_replay_rows_need_no_concatenation():
    parts = _parts()
    c = ComposedBatch(parts)
    assert torch.equal(c.advantages, torch.cat([p.advantages for p in parts]))
    assert c.ref_logps is None and c._dense is None
    rows = torch.arange(12, 20)
    _same(c.select(rows), parts[1])  # the second segment's rows, at its own widths
    assert c._dense is None


@pytest.mark.parametrize("idx", [[0, 3, 12, 19], [13, 2, 5], [], [-1, 0], [11, 12]])
def test_select_equals_selecting_from_the_concatenation(idx):
    parts = _parts()
    got, want = ComposedBatch(parts).select(idx), RolloutBatch.concat(parts).select(idx)
    assert len(got) == len(want)
    for f in ("advantages", "birth_step", "is_replay", "completion_lengths", "prompt_lengths"):
        a, b = getattr(got, f), getattr(want, f)
        a, b = (a(), b()) if callable(a) else (a, b)
        assert torch.equal(a, b), f
    for r in range(len(idx)):  # same real tokens (widths may differ: only the rows asked for are padded)
        for f, lens in (("completion_ids", "completion_lengths"), ("behaviour_logps", "completion_lengths")):
            n = int(getattr(got, lens)()[r])
            assert torch.equal(getattr(got, f)[r, :n], getattr(want, f)[r, :n].to(getattr(got, f).dtype))


def test_select_out_of_range_raises():
    with pytest.raises(IndexError):
        ComposedBatch(_parts()).select([20])


@pytest.mark.parametrize("size", [None, 1, 5, 64])
def test_micro_batches_are_views_of_one_segment_each(size):
    parts = _parts()
    micro = list(ComposedBatch(parts).micro_batches(size))
    assert sum(len(m) for m in micro) == 20
    assert len(micro) == sum(-(-len(p) // (size or len(p))) for p in parts)
    row = 0
    for m in micro:
        seg = parts[0] if row < 12 else parts[1]
        lo = row if row < 12 else row - 12
        assert m.completion_ids.data_ptr() == seg.completion_ids[lo:].data_ptr()  # a view, not a copy
        _same(m, seg.select(torch.arange(lo, lo + len(m))))
        row += len(m)


def test_reassigning_the_callers_field_leaves_the_composed_batch_alone():
    parts = _parts()
    c = ComposedBatch(parts)
    before = c.behaviour_logps.clone()
    parts[0].behaviour_logps = torch.zeros_like(parts[0].behaviour_logps)
    assert torch.equal(ComposedBatch(c.parts).behaviour_logps, before)


def test_mixed_ref_rejected_and_empty_segments_dropped():
    a, b = _parts()
    with pytest.raises(ValueError, match="ref_logps"):
        ComposedBatch([make_batch(1, 2, with_ref=True), b])
    c = ComposedBatch([a, b.select(torch.arange(0))])
    assert len(c.parts) == 1 and len(c) == len(a)
    _same(c, a)


def test_compose_batch_keeps_fresh_rows_uncopied():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0), seed=0)
    buf.add(make_batch(4, 4, step=0, seed=1), 0)
    fresh = make_batch(4, 4, step=1, seed=2)
    out = compose_batch(fresh, buf, 1).batch
    assert isinstance(out, ComposedBatch) and out.parts[0].completion_ids is fresh.completion_ids
    assert int(out.is_replay.sum()) == 8 and out._dense is None
