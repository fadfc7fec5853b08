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
