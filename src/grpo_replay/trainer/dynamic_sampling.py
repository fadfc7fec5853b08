"""`TrainConfig.dynamic_sampling`: DAPO's dynamic sampling (verl's `algorithm.filter_groups`) in the built-in trainer.

A step generates rounds of `prompts_per_step` fresh prompts x G rollouts; each round is scored and filtered for
zero-variance groups like a plain step, and rounds continue until the kept groups reach `prompts_per_step` or
`max_generation_rounds` rounds have run. The update gets the first `prompts_per_step` kept groups in generation
order (verl's DAPO trainer keeps `batch[:train_batch_size * n]`); the surplus is discarded, neither trained on
nor stored for replay. A step that reaches the cap short of `prompts_per_step` groups trains on the groups it
holds (the DAPO recipe raises an error there; a comparison must not stop a run halfway); with
`replay.fill_filtered` the missing groups' rows are filled from the replay buffer instead (`unfilled_rows`), so a
cap of k rounds sits between fill_filtered alone (k = 1) and DAPO (k = 10). Every round's rollouts count in
`generated`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..rollout import RolloutBatch, cat_padded


class Round(NamedTuple):
    """One generation round (steps 1-3 of Algorithm 1) or several merged."""

    fresh: RolloutBatch  # the kept rows (non-zero-variance groups), behaviour log-probs still zeros
    rewards: torch.Tensor  # (N,) every generated row's reward
    keep: torch.Tensor  # (N,) bool, rows in a non-zero-variance group
    completion_mask: torch.Tensor  # (N, C) of the generated rows
    reward_counts: dict  # reward/errors, reward/timeouts
    t_generate: float  # seconds spent generating
    n_generated: int  # N
    rounds: int = 1


def kept_groups(fresh: RolloutBatch) -> int:
    return int(torch.unique(fresh.group_ids).numel()) if len(fresh) else 0


def needs_another_round(rounds: list[Round], prompts_per_step: int, max_rounds: int) -> bool:
    """Whether the step generates one more round: fewer than `prompts_per_step` groups kept, rounds left."""
    return len(rounds) < max_rounds and sum(kept_groups(r.fresh) for r in rounds) < prompts_per_step


def merge(rounds: list[Round], prompts_per_step: int) -> Round:
    """The step's rounds as one: every generated row in the per-row fields, and the first `prompts_per_step` kept
    groups (in generation order) as the fresh batch, with group ids renumbered 0..n_groups-1. One round is
    returned unchanged."""
    if len(rounds) == 1:
        return rounds[0]
    offset, parts = 0, []
    for r in rounds:
        f = r.fresh
        if len(f):
            _, dense = torch.unique(f.group_ids, return_inverse=True)  # ascending ids keep the row order
            f.group_ids = dense + offset
            offset += int(dense.max()) + 1
            parts.append(f)
    fresh = RolloutBatch.concat(parts) if parts else rounds[0].fresh
    if len(fresh):
        fresh = fresh.select((fresh.group_ids < prompts_per_step).nonzero().squeeze(1))
    counts = {k: sum(r.reward_counts[k] for r in rounds) for k in rounds[0].reward_counts}
    return Round(
        fresh=fresh,
        rewards=torch.cat([r.rewards for r in rounds]),
        keep=torch.cat([r.keep for r in rounds]),
        completion_mask=cat_padded([r.completion_mask for r in rounds], left=False, value=0),
        reward_counts=counts,
        t_generate=sum(r.t_generate for r in rounds),
        n_generated=sum(r.n_generated for r in rounds),
        rounds=len(rounds),
    )


def unfilled_rows(merged: Round) -> int:
    """The rows the step's update lacks against one unfiltered round (prompts_per_step x G): what
    `replay.fill_filtered` fills from the buffer. For one round these are the rows the zero-variance filter
    removed; after several, only the shortfall left at the round cap (the surplus groups are not counted)."""
    return merged.n_generated // merged.rounds - len(merged.fresh)


def metrics(merged: Round) -> dict:
    """dynamic/rounds (generation rounds this step) and dynamic/groups (groups in the update's fresh rows; below
    prompts_per_step only when the round cap was reached)."""
    return {"dynamic/rounds": merged.rounds, "dynamic/groups": kept_groups(merged.fresh)}
