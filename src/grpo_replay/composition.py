"""Batch compositions by name. One signature: (fresh, draw, n_replay, rng) -> (composed, fresh_index).

`n_replay` is the replay rows to ask for: the composition's own count (`PLANNED_ROWS`) unless the step's plan
(step_plan.py) fitted it to an engine's unit. `draw(n)` returns at most n replay rows from the buffer (empty during warm-up): exactly min(n, stored) at
rollout granularity, whole groups at group granularity (`GroupPrioritizedSampler`: groups in draw order,
each taken if it fits, so n exactly when the group sizes allow it, else fewer). The composition decides how
many to ask for and how they meet the fresh rows. The replay rows' group ids are renumbered past the fresh
rows' (1 + the largest fresh id, then one id per drawn group in draw order), so group ids are unique within
the composed batch, as `RolloutBatch` says; rows of one stored group still share one. The composed batch holds the kept fresh rows first (in
their original order), then the replay rows, as a `ComposedBatch` (composed.py: a `RolloutBatch` that keeps
the two segments and concatenates their token fields only if they are read); `fresh_index` (long) lists
which fresh rows were kept, so an integration can map the composed rows back to its own batch.
`compose_batch` is the single call site. Each composition registers, under the same name, its row count (fresh
rows kept, replay rows asked for: `PLANNED_ROWS`), the fresh rows it keeps beside a given number of replay rows
(`KEPT_ROWS`) and, where it has one, its rule for a step of a fixed total size (`FIXED_ROWS`, TRL async's), so that
`step_plan` plans a step with the rules that compose it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import numpy as np
import torch

from .composed import ComposedBatch
from .registry import Registry
from .rollout import RolloutBatch, unchecked_batch

Draw = Callable[[int], RolloutBatch]
CompositionFn = Callable[[RolloutBatch, Draw, int, np.random.Generator], tuple[RolloutBatch, torch.Tensor]]
COMPOSITIONS: Registry[CompositionFn] = Registry("composition", params=("fresh", "draw", "n_replay", "rng"))
RowCountFn = Callable[[int, float], tuple[int, int]]
PLANNED_ROWS: Registry[RowCountFn] = Registry("composition row count", params=("n_fresh", "replay_ratio"))
KeptFn = Callable[[int, int], int]
KEPT_ROWS: Registry[KeptFn] = Registry("composition kept rows", params=("n_fresh", "n_replay"))
FIXED_ROWS: Registry[RowCountFn] = Registry("composition fixed-size rule", params=("total", "replay_ratio"))


@PLANNED_ROWS.register("fresh_anchored")
def fresh_anchored_rows(n_fresh: int, replay_ratio: float) -> tuple[int, int]:
    """(every fresh row, round(replay_ratio * n_fresh) replay rows)."""
    return n_fresh, round(replay_ratio * n_fresh)


@PLANNED_ROWS.register("pool")
def pool_rows(n_fresh: int, replay_ratio: float) -> tuple[int, int]:
    """(n_fresh - k fresh rows, k replay rows), k = round(n_fresh * replay_ratio / (1 + replay_ratio)): the
    replay share fresh_anchored gives, within a fixed total."""
    k = round(n_fresh * replay_ratio / (1.0 + replay_ratio))
    return n_fresh - k, k


@KEPT_ROWS.register("fresh_anchored")
def fresh_anchored_kept(n_fresh: int, n_replay: int) -> int:
    return n_fresh


@KEPT_ROWS.register("pool")
def pool_kept(n_fresh: int, n_replay: int) -> int:
    return n_fresh - n_replay


@FIXED_ROWS.register("fresh_anchored")
def fresh_anchored_fixed(total: int, replay_ratio: float) -> tuple[int, int]:
    """(n fresh rows taken, replay rows asked for) of a step of `total` rows: n = round(total / (1 + replay_ratio))
    (at least 1) and round(replay_ratio * n) replay rows, at most the total's room; a short draw is made up with
    more fresh rows by the engine."""
    n = max(1, round(total / (1.0 + replay_ratio)))
    return n, min(round(replay_ratio * n), total - n)


@FIXED_ROWS.register("pool")
def pool_fixed(total: int, replay_ratio: float) -> tuple[int, int]:
    """(total fresh rows taken, pool's replay count): replay rows displace fresh ones within the total."""
    return total, pool_rows(total, replay_ratio)[1]


@COMPOSITIONS.register("fresh_anchored")
def fresh_anchored(
    fresh: RolloutBatch, draw: Draw, n_replay: int, rng: np.random.Generator
) -> tuple[RolloutBatch, torch.Tensor]:
    """The paper's: every fresh row + n_replay replay rows (at most: see `draw`), concatenated (as a
    `ComposedBatch`: the fresh rows are not copied)."""
    replay = _whole_groups_within(draw(n_replay), n_replay)
    return ComposedBatch([fresh, replay]), torch.arange(len(fresh))


@COMPOSITIONS.register("pool")
def pool(
    fresh: RolloutBatch, draw: Draw, n_replay: int, rng: np.random.Generator
) -> tuple[RolloutBatch, torch.Tensor]:
    """The naive baselines': a fixed total of n_fresh rows in which replay rows displace fresh ones.

    With its own count (`pool_rows`) the replay share is replay_ratio / (1 + replay_ratio), the same share
    fresh_anchored gives, so the composition ablation changes only whether fresh rows are dropped. Displaced
    fresh rows are chosen at random (still inserted into the buffer by the caller: they were generated anyway).
    """
    n = len(fresh)
    replay = _whole_groups_within(draw(min(n_replay, n)), min(n_replay, n))
    keep = torch.from_numpy(np.sort(rng.permutation(n)[: n - len(replay)]))
    return ComposedBatch([fresh.select(keep), replay]), keep


def _whole_groups_within(replay: RolloutBatch, k: int) -> RolloutBatch:
    """At most k rows of `replay`, dropping whole groups (in draw order, a group that does not fit is
    skipped). The buffer's own samplers never overshoot; a custom `Sampler` may (the share is a bound)."""
    if len(replay) <= k:
        return replay
    _, inv, sizes = torch.unique(replay.group_ids, return_inverse=True, return_counts=True)
    first = torch.full((len(sizes),), len(replay), dtype=torch.long).scatter_reduce(0, inv, torch.arange(len(replay)), "amin")
    taken, room = torch.zeros(len(sizes), dtype=torch.bool), k
    for g in torch.argsort(first).tolist():  # groups in draw order
        if sizes[g] <= room:
            taken[g], room = True, room - int(sizes[g])
    return replay.select(taken[inv].nonzero().squeeze(1))


class Composed(NamedTuple):
    """What `compose_batch` returns (also unpacks as `batch, fresh_index = compose_batch(...)`)."""

    batch: RolloutBatch
    """The update batch: the kept fresh rows first, in their original order, then the replay rows."""
    fresh_index: torch.Tensor
    """(n_kept,) long: indices into `fresh` of the kept rows, in the batch's order (all of them unless the
    composition displaces some, as `pool` does)."""


def compose_batch(fresh: RolloutBatch, buffer, step: int, n_filtered: int | None = None,
                  n_replay: int | None = None) -> Composed:
    """Algorithm 1 steps 4-6: evict, sample, compose. `buffer` is a `ReplayBuffer`. `n_replay`: the replay rows
    to ask for (a step plan's count fitted to an engine's unit); None: the composition's own count.

    `n_filtered`: the fresh rows the zero-variance filter removed this step. With `fill_filtered` it is the
    replay count (required then; `fresh` may be empty): every kept fresh row + up to n_filtered replay rows,
    concatenated as fresh_anchored does, so the update has as many rows as were generated (fewer during
    warm-up or while the buffer holds fewer). Without `fill_filtered` it is not used."""
    cfg = buffer.config
    draw = lambda n: groups_after(fresh, buffer.sample(n, step))  # noqa: E731
    if cfg.fill_filtered:
        check_n_filtered(n_filtered)
        k = n_filtered if n_replay is None else n_replay
        replay = _whole_groups_within(draw(k), k)
        return Composed(ComposedBatch([fresh, replay]), torch.arange(len(fresh)))
    fn = COMPOSITIONS.get(cfg.composition)
    k = PLANNED_ROWS.get(cfg.composition)(len(fresh), cfg.replay_ratio)[1] if n_replay is None else n_replay
    return Composed(*fn(fresh, draw, k, buffer.rng))


def check_n_filtered(n_filtered) -> None:
    """ValueError unless `n_filtered` is fill_filtered's replay count: an integer >= 0."""
    if n_filtered is None or isinstance(n_filtered, bool) or not isinstance(n_filtered, int) or n_filtered < 0:
        raise ValueError(
            f"compose_batch: n_filtered={n_filtered!r} is invalid; allowed: an integer >= 0 (the fresh rows "
            "the zero-variance filter removed), required with ReplayConfig.fill_filtered"
        )


def groups_after(fresh: RolloutBatch, replay: RolloutBatch) -> RolloutBatch:
    """`replay` with its group ids renumbered past `fresh`'s: 1 + the largest fresh id for the first group
    in row order, then one more per group (rows that shared an id share the new one)."""
    if len(replay) == 0:
        return replay
    base = int(fresh.group_ids.max()) + 1 if len(fresh) else 0
    uniq, inv = torch.unique(replay.group_ids, return_inverse=True)
    first = torch.full((len(uniq),), len(replay), dtype=torch.long).scatter_reduce(0, inv, torch.arange(len(replay)), "amin")
    rank = torch.empty_like(first)
    rank[torch.argsort(first)] = torch.arange(len(uniq))
    fields = {f.name: getattr(replay, f.name) for f in dataclasses.fields(RolloutBatch)}
    return unchecked_batch({**fields, "group_ids": base + rank[inv]})
