"""Priorities (priority.py): one signature (columns, config), the built-in signals, a custom one."""
import numpy as np
import pytest
import torch

from grpo_replay import PRIORITIES, ReplayBuffer, ReplayConfig
from grpo_replay.registry import Registry
from helpers import buffer_with_advantages as _buffer_with_advantages
from helpers import make_batch


def test_uniform_and_group_std_behave_as_named():
    from scipy.stats import chisquare

    adv = [0.0, 0.1, -0.5, 1.0]
    buf = _buffer_with_advantages(adv, priority="uniform", seed=1)
    counts = np.bincount([int(buf.sampler.sample(buf.storage, 1, buf.rng)[0]) for _ in range(8000)], minlength=4)
    assert chisquare(counts).pvalue > 1e-3
    # group_std: rows of one group share a weight whatever their |A|
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, priority="group_std"), seed=0)
    b = make_batch(2, 4, rewards=torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0]))
    buf.add(b, 0)
    w = buf.storage.col("weight")[buf.storage.valid_slots()]
    assert np.allclose(w[:4], w[0]) and np.allclose(w[4:], w[4]) and w[4] > w[0]  # std 0.577 > 0.5


def test_builtin_priorities_from_columns_and_config():
    cfg = ReplayConfig(alpha=0.5, eps=1e-6)
    cols = {"advantage": np.array([0.0, -1.0, 4.0], np.float32), "group_std": np.array([0.5, 0.5, 2.0], np.float32)}
    assert np.allclose(PRIORITIES.get("abs_advantage")(cols, cfg), (np.abs(cols["advantage"]) + 1e-6) ** 0.5)
    assert np.allclose(PRIORITIES.get("group_std")(cols, cfg), (cols["group_std"] + 1e-6) ** 0.5)
    assert PRIORITIES.get("uniform")(cols, cfg).tolist() == [1.0, 1.0, 1.0]
    for name in PRIORITIES.names():
        assert PRIORITIES.get(name)(cols, cfg).dtype == np.float64


@pytest.fixture
def scratch_priorities(monkeypatch):
    """Registrations made in a test are dropped after it."""
    monkeypatch.setattr(PRIORITIES, "_items", dict(PRIORITIES._items))


def test_a_priority_reads_any_stored_column(tmp_path, scratch_priorities):
    """A length-aware priority is one registered function; the weight it gives is frozen and survives a save."""
    name = "test_shorter_first"
    PRIORITIES.register(name)(lambda columns, config: 1.0 / (1.0 + columns["comp_len"]))
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, priority=name), seed=0)
    b = make_batch(2, 3, seed=4, max_completion=9)
    buf.add(b, 0)
    slots = buf.storage.valid_slots()
    assert np.allclose(buf.storage.col("weight")[slots], 1.0 / (1.0 + b.completion_lengths().numpy()))
    buf.save(tmp_path / "b")
    assert len(ReplayBuffer.load(tmp_path / "b")) == 6


def test_priority_signature_is_checked_and_bad_weights_are_refused(scratch_priorities):
    with pytest.raises(TypeError, match="every priority takes"):
        PRIORITIES.register("test_old_signature")(lambda advantages, group_std, alpha, eps: advantages)
    name = "test_negative"
    PRIORITIES.register(name)(lambda columns, config: -np.ones(len(columns["advantage"])))
    with pytest.raises(ValueError, match="finite weights >= 0"):
        ReplayBuffer(ReplayConfig(priority=name)).add(make_batch(1, 2), 0)
    assert isinstance(PRIORITIES, Registry)


def test_scratch_registrations_are_gone():
    assert not any(n.startswith("test_") for n in PRIORITIES.names())
