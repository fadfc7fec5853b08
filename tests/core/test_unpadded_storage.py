"""`RolloutStorage(unpadded=True)`: completions kept without padding (ragged.py) give the rows, draws and saved
state a padded storage gives, in less memory, and the ring reuses the space of evicted rows."""
import inspect

import numpy as np
import pytest
import torch

from grpo_replay import ReplayBuffer, ReplayConfig, ragged
from grpo_replay.padded import PaddedArena
from grpo_replay.padding import prefix_rows
from grpo_replay.storage import RolloutStorage
from helpers import make_batch


def _pair(config, seed=0):
    return (ReplayBuffer(config, seed=seed), ReplayBuffer(config, seed=seed, storage=RolloutStorage(unpadded=True)))


def _same_rows(a, b):
    """Equal batches at every position up to each row's last counted token; past it the unpadded storage has
    zeros and a padded one what the fresh batch held there (padding, masked out by every consumer)."""
    assert set(a.__dict__) == set(b.__dict__)
    for k, va in a.__dict__.items():
        vb = getattr(b, k)
        if va is None or vb is None:
            assert va is None and vb is None, k
        elif k in ("completion_ids", "behaviour_logps", "ref_logps"):
            assert va.shape == vb.shape and va.dtype == vb.dtype, k
            keep = torch.from_numpy(prefix_rows(_lengths(a), va.shape[1]))
            assert torch.equal(va[keep], vb[keep]), k
            assert not vb[~keep].any(), k
        else:
            assert torch.equal(va, vb), k


def _lengths(batch):
    """Each row's last counted completion position + 1."""
    m = batch.completion_mask.bool().numpy()
    if m.shape[1] == 0:
        return np.zeros(len(m), np.int64)
    return np.where(m.any(1), m.shape[1] - np.argmax(m[:, ::-1], axis=1), 0)


def _noisy(batch, rng):
    """Rows with a mask that is not a prefix (tool output), some rows with no completion at all."""
    m = batch.completion_mask  # changed in place
    for i in range(len(m)):
        r = rng.random()
        if r < 0.15 and m[i].sum() > 2:
            m[i, 1] = 0
        elif r < 0.2:
            m[i] = 0
    return batch


@pytest.fixture(params=["row copies", "one gather"])
def copies(request, monkeypatch):
    """Both ways the unpadded arena moves rows: a slice per row (long rows) and one flat gather (short ones)."""
    monkeypatch.setattr(ragged, "LONG_ROWS", 0 if request.param == "row copies" else 10**9)


def test_both_completion_arenas_answer_the_same_calls():
    """The storage holds either arena and calls it without asking which: same public methods, same parameters."""
    def calls(cls):
        return {name: list(inspect.signature(f).parameters) for name, f in vars(cls).items()
                if callable(f) and not name.startswith("_")}

    assert calls(PaddedArena) == calls(ragged.RaggedArena)


@pytest.mark.parametrize("with_ref", [False, True])
def test_unpadded_storage_gives_the_padded_storages_draws_rows_and_state(tmp_path, with_ref, copies):
    rng = np.random.default_rng(0)
    config = ReplayConfig(warmup_steps=0, tau_max=3, capacity=200, max_uses=3)
    padded, unpadded = _pair(config)
    for step in range(40):
        wide = int(rng.integers(2, 40))
        batch = _noisy(make_batch(int(rng.integers(1, 5)), 4, step=step, seed=step, max_completion=wide,
                                  with_ref=with_ref), rng)
        for buf in (padded, unpadded):
            buf.add(batch, step)
        n = int(rng.integers(0, 30))
        a, b = padded.sample(n, step + 1), unpadded.sample(n, step + 1)
        _same_rows(a, b)
        slots = padded.storage.valid_slots()
        assert np.array_equal(slots, unpadded.storage.valid_slots())
        for s in slots[:5]:
            ra, rb = padded.storage.tokens(int(s)), unpadded.storage.tokens(int(s))
            for x, y in zip(ra, rb):
                assert (x is None and y is None) or np.array_equal(x, y)
    sa, sb = padded.state_dict(), unpadded.state_dict()
    for k in sa["storage"]:
        va, vb = sa["storage"][k], sb["storage"][k]
        if k != "widths":  # the padded arenas' allocated widths; the unpadded storage reports the widest row's
            assert np.array_equal(np.asarray(va), np.asarray(vb)), k
    # the saved format does not depend on the layout: each loads into the other, and draws go on the same
    padded.save(tmp_path / "p")
    unpadded.save(tmp_path / "u")
    back_u = ReplayBuffer.load(tmp_path / "p", storage=RolloutStorage(unpadded=True))
    back_p = ReplayBuffer.load(tmp_path / "u")
    for buf in (back_u, back_p):
        _same_rows(padded.sample(20, 41), buf.sample(20, 41))
        padded.load_state_dict(sa)  # draw again from the same state


def test_unpadded_storage_holds_the_real_positions_only():
    """Completions of very different lengths: the padded arenas hold every row at the widest row's width."""
    rng = np.random.default_rng(1)
    config = ReplayConfig(warmup_steps=0, tau_max=None, capacity=None)
    padded, unpadded = _pair(config)
    for step in range(8):
        batch = make_batch(8, 8, step=step, seed=step, max_completion=512)
        C = batch.completion_mask.shape[1]
        keep = torch.arange(C)[None, :] < torch.from_numpy(rng.integers(1, 64, 64))[:, None]
        keep[0] = True  # one long row per batch: the width the padded arenas take
        batch.completion_mask = batch.completion_mask * keep
        for buf in (padded, unpadded):
            buf.add(batch, step)
    real = sum(int(n) for n in unpadded.storage.col("comp_len")[unpadded.storage.valid_slots()])
    tokens_bytes = unpadded.storage.completions.nbytes()
    assert tokens_bytes <= 2 * 9 * real + 16 * unpadded.storage.slots + 9 * 1024  # ids, log-probs (+ mask), slack
    assert unpadded.storage.nbytes() < 0.3 * padded.storage.nbytes()


def test_the_ring_reuses_the_space_of_evicted_rows(copies):
    """Age eviction frees the oldest runs: the positions stay bounded by what tau_max keeps, not by what was
    ever added; rows freed out of order (max_uses) wait for their run and are never overwritten while stored."""
    rng = np.random.default_rng(2)
    config = ReplayConfig(warmup_steps=0, tau_max=4, capacity=None, max_uses=1)
    buf, ref = ReplayBuffer(config, storage=RolloutStorage(unpadded=True)), ReplayBuffer(config)
    added = []
    for step in range(300):
        batch = make_batch(4, 4, step=step, seed=step, max_completion=int(rng.integers(1, 60)))
        buf.add(batch, step)
        ref.add(batch, step)
        added.append(int(_lengths(batch).sum()))
        _same_rows(ref.sample(5, step + 1), buf.sample(5, step + 1))
        assert len(buf.storage.completions._order) <= 5  # the runs of the tau_max + 1 youngest birth steps at most
    window = max(sum(added[i : i + 5]) for i in range(len(added)))  # what five birth steps held at most
    assert buf.storage.completions.cap <= 4 * window + 1024
    assert sum(added) > 10 * buf.storage.completions.cap  # the space was reused many times over
