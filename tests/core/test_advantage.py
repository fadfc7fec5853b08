import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_replay import group_advantages, nonzero_variance_mask


def test_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    gid = torch.tensor([0, 0, 0, 0, 1, 1])
    adv, std = group_advantages(r, gid, eps=0.0)
    s = torch.tensor([1.0, 0, 0, 0]).std().item()  # sample std = 0.5
    assert abs(s - 0.5) < 1e-7
    assert torch.allclose(adv[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]))
    assert torch.allclose(adv[4:], torch.zeros(2))
    assert torch.allclose(std, torch.tensor([0.5] * 4 + [0.0] * 2))
    adv_none, _ = group_advantages(r, gid, scale="none")
    assert torch.allclose(adv_none[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_zero_variance_filter():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    gid = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    assert nonzero_variance_mask(r, gid).tolist() == [False, False, True, True, False, False, False, False]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=2, max_size=40), st.integers(1, 8))
def test_matches_per_group_loop(rewards, group_size):
    r = torch.tensor(rewards, dtype=torch.float32)
    gid = torch.arange(len(r)) // group_size
    perm = torch.randperm(len(r))  # any row order
    r, gid = r[perm], gid[perm]
    adv, std = group_advantages(r, gid, eps=1e-4)
    for g in gid.unique():
        m = gid == g
        rg = r[m].double()
        s = rg.std() if m.sum() > 1 else torch.tensor(0.0, dtype=torch.float64)
        assert torch.allclose(adv[m].double(), (rg - rg.mean()) / (s + 1e-4), atol=1e-5)
        assert bool(nonzero_variance_mask(r, gid)[m].all()) == bool(rg.max() != rg.min())


# --- the estimator registry: hand-computed numbers and a per-row loop ------------------------------------

from grpo_replay import ESTIMATORS, estimate  # noqa: E402
from helpers import estimator_loop  # noqa: E402

R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0])
GID = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])


def test_registry_holds_the_estimators():
    assert ESTIMATORS.names() == ["dr_grpo", "grpo", "grpo_batch", "reinforce_plus_plus_baseline", "rloo"]
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'; allowed: dr_grpo, grpo, grpo_batch"):
        estimate("ppo", R, GID)


def test_rloo_hand_computed():
    adv, std = estimate("rloo", R, GID)
    # group 0: 1 - 0 = 1, 0 - 1/3 = -1/3; group 1: all equal; group 2: 0.5 - 0, 0 - 0.5
    assert torch.allclose(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.5, -0.5]))
    assert torch.allclose(std[:4], torch.full((4,), 0.5))  # the group std, whatever the estimator


def test_grpo_batch_hand_computed():
    adv, _ = estimate("grpo_batch", R, GID, eps=0.0)
    s = float(R.double().std())  # the std of every reward of the batch: sqrt(55/224) = 0.4955
    assert abs(s - (55 / 224) ** 0.5) < 1e-12
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.25, -0.25]) / s)


def test_reinforce_plus_plus_baseline_hand_computed():
    adv, _ = estimate("reinforce_plus_plus_baseline", R, GID, eps=0.0)
    d = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.25, -0.25], dtype=torch.float64)  # mean 0
    s = (float((d * d).sum()) / 7) ** 0.5  # sample std of the deviations: sqrt(0.875 / 7)
    assert torch.allclose(adv, (d / s).float())
    assert adv[4] == 0 and adv[5] == 0  # a zero-variance group keeps A = 0


def test_dr_grpo_and_grpo_are_the_scales_of_group_advantages():
    for name, scale in (("grpo", "group"), ("dr_grpo", "none"), ("grpo_batch", "batch")):
        assert torch.equal(estimate(name, R, GID)[0], group_advantages(R, GID, scale=scale)[0])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]), min_size=2, max_size=30), st.integers(1, 6),
       st.sampled_from(sorted(["grpo", "dr_grpo", "grpo_batch", "rloo", "reinforce_plus_plus_baseline"])))
def test_estimators_match_a_per_row_loop(rewards, group_size, name):
    r = torch.tensor(rewards, dtype=torch.float32)
    gid = torch.arange(len(r)) // group_size
    perm = torch.randperm(len(r))  # any row order
    r, gid = r[perm], gid[perm]
    adv, _ = estimate(name, r, gid, eps=1e-4)
    assert torch.allclose(adv.double(), estimator_loop(name, r, gid, 1e-4), atol=1e-5), name


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "grpo_batch", "rloo", "reinforce_plus_plus_baseline"])
def test_zero_variance_groups_get_zero_advantage(name):
    """The zero-variance filter drops exactly the rows whose advantage is 0 by construction, for every estimator."""
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    gid = torch.tensor([0, 0, 1, 1, 2, 2])
    adv, _ = estimate(name, r, gid)
    assert adv[[0, 1, 4, 5]].abs().max() == 0 and adv[[2, 3]].abs().min() > 0
