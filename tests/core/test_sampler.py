"""Samplers (sampler.py): distributions of the tree and Gumbel draws, replacement, whole-group draws, parts."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from grpo_replay import ReplayBuffer, ReplayConfig
from grpo_replay.parts import BufferPart
from grpo_replay.sampler import GroupPrioritizedSampler, PrioritizedSampler, Sampler
from helpers import buffer_with_advantages as _buffer_with_advantages
from helpers import make_batch


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


def test_group_granularity_draws_whole_groups():
    buf = ReplayBuffer(ReplayConfig.uniform_pool(warmup_steps=0), seed=0)
    buf.add(make_batch(n_groups=6, group_size=4, seed=2), 0)
    out = buf.sample(6, 1)
    assert len(out) == 4  # whole groups within 6 rows: one group of 4 (two would overshoot to 8)
    ids, counts = out.group_ids.unique(return_counts=True)
    assert len(ids) == 1 and (counts == 4).all()
    out = buf.sample(8, 1)
    ids, counts = out.group_ids.unique(return_counts=True)
    assert len(out) == 8 and len(ids) == 2 and (counts == 4).all()  # exact where the group sizes allow


def test_config_picks_the_sampler_and_a_custom_sampler_is_a_part():
    assert type(ReplayBuffer(ReplayConfig()).sampler) is PrioritizedSampler
    assert type(ReplayBuffer(ReplayConfig.uniform_pool()).sampler) is GroupPrioritizedSampler

    class Newest(Sampler):
        """Replays the most recently inserted rows."""

        def sample(self, storage, n_rows, rng):
            slots = storage.valid_slots()
            return slots[np.argsort(-storage.col("seq")[slots], kind="stable")[:n_rows]]

    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None), sampler=Newest())
    buf.add(make_batch(1, 4, step=0, seed=0), 0)
    buf.add(make_batch(1, 4, step=1, seed=1), 1)
    assert buf.sample(3, 2).birth_step.tolist() == [1, 1, 1]
    assert isinstance(buf.sampler, BufferPart) and buf.state_dict()["sampler"] == {}


def test_sampler_draws_straight_from_a_storage():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0), seed=0)
    buf.add(make_batch(3, 4, seed=0), 0)
    rng = np.random.default_rng(0)
    rows = PrioritizedSampler().sample(buf.storage, 5, rng)
    assert len(set(rows.tolist())) == 5 and buf.storage.valid[rows].all()
    groups = GroupPrioritizedSampler().sample(buf.storage, 5, rng)
    keys = buf.storage.col("group_key")[groups]
    assert len(groups) == 4 and len(set(keys.tolist())) == 1  # whole groups of 4 within 5 rows: one
    assert len(PrioritizedSampler().sample(buf.storage, 0, rng)) == 0


@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_group_draws_fill_the_rows_with_the_groups_that_fit(replacement, seed):
    """Whole groups, never more than n_rows in all; a group too big for the rows still missing is passed
    over and smaller ones after it are taken (a stored group of 8 must not leave a share of 3 empty)."""
    buf = ReplayBuffer(ReplayConfig.uniform_pool(warmup_steps=0, replacement=replacement), seed=seed)
    for t, size in enumerate([8, 2, 1]):
        buf.add(make_batch(1, size, step=t, seed=t), t)
    out = buf.sample(3, 3)
    assert len(out) == 3 and 8 not in out.group_ids.unique(return_counts=True)[1].tolist()
    stored = {1, 2, 8}
    for n_rows in range(1, 14):
        out = buf.sample(n_rows, 3)
        taken = out.group_ids.unique(return_counts=True)[1].tolist()
        assert len(out) <= n_rows
        # none left out fits the rows still missing (with replacement any group may come again)
        left = stored if replacement else stored - set(taken)
        assert all(size > n_rows - len(out) for size in left)


def _smallest_by_full_partition(keys, k):
    top = np.argpartition(keys, k - 1)[:k]
    return top[np.argsort(keys[top], kind="stable")]


@pytest.mark.parametrize("weights", ["uniform", "skewed", "periodic", "zeros"])
@pytest.mark.parametrize("n", [100, 2048, 9984, 50_000])
def test_smallest_keys_equals_a_full_partition(weights, n):
    """The prefiltered selection gives the same indices in the same order as partitioning every key, for
    weights the stride could sample badly (its period), many zero weights (inf keys) and every k up to n."""
    from grpo_replay.sampler import _PREFILTER_STRIDE, smallest_keys

    rng = np.random.default_rng(n)
    w = {"uniform": rng.random(n) + 0.1, "skewed": rng.pareto(0.5, n) + 1e-6,
         "periodic": np.where(np.arange(n) % _PREFILTER_STRIDE == 0, 1e-3, 1.0),
         "zeros": np.where(rng.random(n) < 0.9, 0.0, rng.random(n))}[weights]
    with np.errstate(divide="ignore"):
        for k in sorted({1, 2, 7, n // 64 + 1, n // 8, n // 8 + 1, n // 2, n - 1}):
            keys = rng.standard_exponential(n) / w
            np.testing.assert_array_equal(smallest_keys(keys, k), _smallest_by_full_partition(keys, k))


def test_smallest_keys_skips_the_full_partition_for_a_small_share(monkeypatch):
    """512 of 10k keys: the bound from a stride of the keys keeps enough, so not every key is partitioned."""
    from grpo_replay.sampler import smallest_keys

    keys = np.random.default_rng(0).standard_exponential(9984)
    expected = _smallest_by_full_partition(keys, 512)

    def refuse(*a, **k):
        raise AssertionError("partitioned every key")

    monkeypatch.setattr(np, "argpartition", refuse)
    np.testing.assert_array_equal(smallest_keys(keys, 512), expected)
