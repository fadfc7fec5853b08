"""Synthetic rollout batches for core tests."""
from __future__ import annotations

import torch

from grpo_replay import RolloutBatch, group_advantages


def make_batch(
    n_groups: int = 4,
    group_size: int = 4,
    step: int = 0,
    seed: int = 0,
    rewards: torch.Tensor | None = None,
    max_prompt: int = 5,
    max_completion: int = 7,
    with_ref: bool = False,
) -> RolloutBatch:
    """A fresh padded batch with varied prompt/completion lengths and binary rewards."""
    g = torch.Generator().manual_seed(seed)
    B = n_groups * group_size
    group_ids = torch.arange(B) // group_size
    if rewards is None:
        rewards = torch.randint(0, 2, (B,), generator=g).float()
    adv, std = group_advantages(rewards, group_ids)
    plen = torch.randint(1, max_prompt + 1, (B,), generator=g)
    clen = torch.randint(1, max_completion + 1, (B,), generator=g)
    P, C = int(plen.max()), int(clen.max())
    pos_p = torch.arange(P).unsqueeze(0)
    prompt_mask = (pos_p >= P - plen.unsqueeze(1)).long()
    comp_mask = (torch.arange(C).unsqueeze(0) < clen.unsqueeze(1)).long()
    prompt_ids = torch.randint(1, 50, (B, P), generator=g) * prompt_mask
    comp_ids = torch.randint(1, 50, (B, C), generator=g) * comp_mask
    logps = -torch.rand(B, C, generator=g) * comp_mask
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=comp_ids,
        completion_mask=comp_mask,
        behaviour_logps=logps,
        advantages=adv,
        rewards=rewards,
        group_ids=group_ids,
        group_std=std,
        birth_step=torch.full((B,), step, dtype=torch.long),
        is_replay=torch.zeros(B, dtype=torch.bool),
        ref_logps=(-torch.rand(B, C, generator=g) * comp_mask) if with_ref else None,
    )
