"""A generation of TRL's batch dict as the core's `RolloutBatch`, for `ReplayGRPOTrainer`.

`fresh_batch` reads the rows of this process out of TRL's output of `_generate_and_score_completions`, with the
rewards TRL gathered over every process, and decides which rows the buffer may take: rows of a group whose
advantages vary (decided on what TRL trains on, over whole groups, which may straddle processes), with a reward
from at least one function, and with a loss token.
"""
from __future__ import annotations

from typing import Any

import torch
from trl.trainer.utils import nanstd

from ...advantage import nonzero_variance_mask
from ...rollout import RolloutBatch


def fresh_batch(trainer, out: dict[str, Any], rewards_per_func: torch.Tensor,
                step: int) -> tuple[RolloutBatch, torch.Tensor, torch.Tensor]:
    """(this process's rows as a RolloutBatch (behaviour log-probs zero when TRL computed none), (n,) bool: in a
    non-zero-variance group and scorable, (n,) bool: has at least one loss token)."""
    n = int(out["advantages"].shape[0])
    G = int(trainer.num_generations)
    rpf = rewards_per_func.float().cpu()
    rewards = (rpf * trainer.reward_weights.float().cpu().unsqueeze(0)).nansum(dim=1)
    unscorable = torch.isnan(rpf).all(dim=1)
    rewards[unscorable] = torch.nan
    groups = torch.arange(rewards.numel()) // G
    grouped = rewards.view(-1, G)
    group_mean = torch.nanmean(grouped, dim=1).nan_to_num(0.0)
    group_std = nanstd(grouped, dim=1).nan_to_num(0.0)
    filled = torch.where(unscorable, group_mean[groups], rewards)
    # Zero variance is decided on what TRL trains on: with normalize_then_sum a group whose weighted reward sum
    # is constant can still have advantages that vary (and one whose sum varies can have none).
    adv = trainer.accelerator.gather(out["advantages"].detach().float()).cpu()
    adv = torch.where(unscorable, torch.nan, adv)
    # Unscorable rows take their group's mean advantage so they neither create nor hide variance.
    adv_mean = torch.nanmean(adv.view(-1, G), dim=1).nan_to_num(0.0)
    ok = nonzero_variance_mask(torch.where(unscorable, adv_mean[groups], adv), groups) & ~unscorable
    lo = trainer.accelerator.process_index * n
    local = slice(lo, lo + n)
    completion_mask = out["completion_mask"]
    if "tool_mask" in out:  # the buffer keeps the loss mask; attention is rebuilt from its length on replay
        completion_mask = completion_mask * out["tool_mask"]
    ref = out.get("ref_per_token_logps")
    old = out.get("old_per_token_logps")  # None: aligned generation, filled from the update's forward
    fresh = RolloutBatch.fresh(
        prompt_ids=out["prompt_ids"].detach().cpu(),
        prompt_mask=out["prompt_mask"].detach().cpu().long(),
        completion_ids=out["completion_ids"].detach().cpu(),
        completion_mask=completion_mask.detach().cpu().long(),
        behaviour_logps=None if old is None else old.detach().float().cpu(),
        advantages=out["advantages"].detach().float().cpu(),
        rewards=filled[local].nan_to_num(0.0),
        group_ids=groups[local],
        group_std=group_std[groups[local]],
        step=step,
        ref_logps=None if ref is None else ref.detach().float().cpu(),
    )
    return fresh, ok[local], completion_mask.detach().cpu().sum(1) > 0
