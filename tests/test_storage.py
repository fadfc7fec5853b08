"""Storage arenas, the sum tree, the tree sampler and the padded concatenation."""
import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from grpo_replay import ReplayBuffer, ReplayConfig, RolloutBatch
from grpo_replay.storage import SumTree
from helpers import make_batch


def test_sum_tree_updates_equal_a_rebuild():
    rng = np.random.default_rng(0)
    for _ in range(100):
        n = int(rng.integers(1, 200))
        tree, w = SumTree(n), np.zeros(n)
        for _ in range(8):
            if rng.random() < 0.5:  # contiguous range (the fast path) or scattered slots
                lo = int(rng.integers(0, n))
                idx = np.arange(lo, int(rng.integers(lo, n)) + 1)
            else:
                idx = rng.choice(n, int(rng.integers(1, n + 1)), replace=False)
            v = rng.random(len(idx))
            tree.set(idx, v)
            w[idx] = v
            ref = SumTree(n)
            ref.rebuild(w)
            assert np.array_equal(tree.t, ref.t)
        assert np.isclose(tree.total, w.sum())
        u = rng.random(50) * tree.total
        assert np.array_equal(tree.find(u), np.searchsorted(np.cumsum(w), u, side="right").clip(max=n - 1))


def _buffer(weights, seed=0):
    """One rollout per weight, |A| = weight, alpha = 1: sampling weight = weight + eps."""
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, alpha=1.0), seed=seed)
    b = make_batch(n_groups=len(weights), group_size=1, seed=0)
    b.advantages = torch.tensor(weights, dtype=torch.float32)
    buf.add(b, 0)
    return buf, np.asarray(weights, dtype=np.float64) + 1e-6


def _pair_counts(buf, n_draws):
    slots = buf.storage.valid_slots().tolist()
    counts = {}
    for _ in range(n_draws):
        a, b = (slots.index(s) for s in buf.sampler.sample(buf.storage, 2, buf.rng))
        counts[(a, b)] = counts.get((a, b), 0) + 1
    return counts


@pytest.mark.parametrize("max_rounds", [4, 0])
def test_tree_sampler_is_successive_proportional(max_rounds):
    """k = 2 of 12 on the tree path (max_rounds 4) or the Gumbel finish alone (0): either way the pair
    (first, second) has probability w_a / W * w_b / (W - w_a) (chi-square over all 132 ordered pairs)."""
    buf, w = _buffer([0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 0.5, 1.0, 4.0, 1.0, 2.0, 3.0], seed=1)
    buf.sampler.MAX_ROUNDS, buf.sampler.TREE_MIN_ROWS = max_rounds, 0
    assert 2 * buf.sampler.TREE_MAX_FRACTION <= len(buf)  # the tree path is taken
    N = 12_000
    counts = _pair_counts(buf, N)
    W = w.sum()
    pairs = [(a, b) for a in range(12) for b in range(12) if a != b]
    expected = np.array([w[a] / W * w[b] / (W - w[a]) for a, b in pairs]) * N
    observed = np.array([counts.get(p, 0) for p in pairs])
    assert observed.sum() == N
    assert chisquare(observed, expected).pvalue > 1e-3
    # power: the same draws are far from "second uniform among the rest"
    wrong = np.array([w[a] / W / 11 for a, b in pairs]) * N
    assert chisquare(observed, wrong).pvalue < 1e-6


def test_gumbel_finish_after_a_partial_tree_draw():
    """One heavy item: the i.i.d. round finds it alone; the Gumbel finish draws the rest, uniform here."""
    buf, w = _buffer([1000.0] + [1.0] * 11, seed=2)
    buf.sampler.MAX_ROUNDS, buf.sampler.TREE_MIN_ROWS = 1, 0
    seconds = np.zeros(12)
    slots = buf.storage.valid_slots().tolist()
    for _ in range(3000):
        out = [slots.index(s) for s in buf.sampler.sample(buf.storage, 3, buf.rng)]
        assert len(set(out)) == 3
        if out[0] == 0:
            seconds[out[1]] += 1
    assert seconds[0] == 0 and seconds.sum() > 2800
    assert chisquare(seconds[1:]).pvalue > 1e-3


def _rows(batch, i):
    pm, cm = batch.prompt_mask[i].bool(), batch.completion_mask[i]
    c = int(torch.nonzero(cm).max()) + 1 if cm.any() else 0
    return batch.prompt_ids[i][pm].tolist(), batch.completion_ids[i, :c].tolist(), cm[:c].tolist(), batch.behaviour_logps[i, :c].tolist()


def test_scattered_slots_and_arena_widening_keep_every_row():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None, capacity=None), seed=0)
    a = make_batch(2, 4, seed=1, max_prompt=3, max_completion=4)
    buf.add(a, 0)
    buf.storage.remove(np.array([1, 3, 6]))  # frees scattered slots: the next insert is not contiguous
    b = make_batch(1, 3, seed=2, max_prompt=9, max_completion=11)  # wider: the arenas grow
    b.completion_mask[0, 1] = 0  # an interior zero (e.g. tool output) is kept
    buf.add(b, 1)
    new = [1, 3, 6]
    assert buf.storage.prompt_ids.shape[1] >= 9 and buf.storage.arena["comp_ids"].shape[1] >= 11
    out = buf.gather(np.array(new))
    for i in range(3):
        assert _rows(out, i) == _rows(b, i)
    kept = [0, 2, 4, 5, 7]
    out = buf.gather(np.array(kept))
    for j, i in enumerate(kept):
        assert _rows(out, j) == _rows(a, i)


def test_prompt_with_interior_zeros_is_compacted_and_ref_presence_must_agree():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0), seed=0)
    b = make_batch(1, 2, seed=3, max_prompt=6)
    b.prompt_ids = torch.tensor([[0, 7, 8, 0, 9], [0, 0, 0, 5, 6]])
    b.prompt_mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 0, 1, 1]])
    buf.add(b, 0)
    out = buf.gather(buf.storage.valid_slots())
    assert out.prompt_ids.tolist() == [[7, 8, 9], [0, 5, 6]] and out.prompt_mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    with pytest.raises(ValueError, match="ref_logps present in this batch but absent in the stored rows"):
        buf.add(make_batch(1, 2, with_ref=True), 1)


def _concat_reference(batches):
    """Pad every part to the shared widths (prompts left, completions right), then cat."""
    P = max(b.prompt_ids.shape[1] for b in batches)
    C = max(b.completion_ids.shape[1] for b in batches)
    out = {}
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "behaviour_logps"):
        parts = []
        for b in batches:
            t = getattr(b, name)
            pad = (P - t.shape[1], 0) if name.startswith("prompt") else (0, C - t.shape[1])
            parts.append(torch.nn.functional.pad(t, pad))
        out[name] = torch.cat(parts)
    return out


@pytest.mark.parametrize("same_widths", [True, False])
def test_concat_pads_with_zeros_to_shared_widths(same_widths):
    a = make_batch(2, 2, seed=1, max_prompt=5, max_completion=7)
    if same_widths:  # the torch.cat path
        b = a.select(torch.tensor([3, 0, 1]))
        b.completion_ids = b.completion_ids + 100
    else:  # wider prompts, narrower completions: both kinds of padding
        b = make_batch(1, 3, seed=2, max_prompt=9, max_completion=3)
        assert b.prompt_ids.shape[1] > a.prompt_ids.shape[1] and b.completion_ids.shape[1] < a.completion_ids.shape[1]
    # garbage in the output buffer must not leak into padding: fill the allocator with non-zero memory first
    for _ in range(3):
        torch.full((64, 64), 7)
    out = RolloutBatch.concat([a, b])
    ref = _concat_reference([a, b])
    for name, t in ref.items():
        assert torch.equal(getattr(out, name), t), name
    assert torch.equal(out.advantages, torch.cat([a.advantages, b.advantages]))


def test_tree_sampler_with_replacement_is_proportional():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, alpha=1.0, replacement=True), seed=4)
    weights = [0.5, 1.0, 2.0, 4.0, 0.0, 3.0]
    b = make_batch(n_groups=len(weights), group_size=1, seed=0)
    b.advantages = torch.tensor(weights)
    buf.add(b, 0)
    buf.sampler.TREE_MIN_ROWS = 0
    draws = buf.sampler.sample(buf.storage, 30_000, buf.rng)
    slots = buf.storage.valid_slots().tolist()
    counts = np.bincount([slots.index(s) for s in draws], minlength=len(weights))
    p = np.array(weights) + 1e-6
    assert chisquare(counts, p / p.sum() * len(draws)).pvalue > 1e-3


def test_ref_arena_only_with_ref_rows_and_ref_added_after_wider_rows_round_trips(tmp_path):
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=0), seed=0)
    buf.add(make_batch(2, 2, seed=1, max_completion=12), 0)
    assert buf.storage.arena["ref"].shape[1] == 0  # no reference log-probs stored: no ref arena
    buf.evict(1)  # empty: the next rows may carry ref_logps
    b = make_batch(2, 2, seed=2, max_completion=5, with_ref=True)
    buf.add(b, 1)
    assert buf.storage.arena["ref"].shape[1] < buf.storage.arena["comp_ids"].shape[1]
    buf.save(tmp_path / "b")
    loaded = ReplayBuffer.load(tmp_path / "b")
    for x in (buf, loaded):
        out = x.gather(x.storage.valid_slots())
        for i in range(len(b)):
            c = int(b.completion_mask[i].sum())
            assert torch.equal(out.ref_logps[i, :c], b.ref_logps[i, :c])
