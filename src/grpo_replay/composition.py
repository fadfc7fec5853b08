"""Batch compositions by name. One signature: (fresh, draw, replay_ratio, rng) -> composed batch.

`draw(n)` returns about n replay rows from the buffer (empty during warm-up); the composition decides how
many to ask for and how they meet the fresh rows. `compose_batch` is the single call site.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .registry import Registry
from .rollout import RolloutBatch

Draw = Callable[[int], RolloutBatch]
CompositionFn = Callable[[RolloutBatch, Draw, float, np.random.Generator], RolloutBatch]
COMPOSITIONS: Registry[CompositionFn] = Registry("composition")


@COMPOSITIONS.register("fresh_anchored")
def fresh_anchored(fresh: RolloutBatch, draw: Draw, replay_ratio: float, rng: np.random.Generator) -> RolloutBatch:
    """The paper's: every fresh row + round(replay_ratio * n_fresh) replay rows, concatenated."""
    replay = draw(round(replay_ratio * len(fresh)))
    return RolloutBatch.concat([fresh, replay])


@COMPOSITIONS.register("pool")
def pool(fresh: RolloutBatch, draw: Draw, replay_ratio: float, rng: np.random.Generator) -> RolloutBatch:
    """The naive baselines': a fixed total of n_fresh rows in which replay rows displace fresh ones.

    The replay share is replay_ratio / (1 + replay_ratio), the same share fresh_anchored gives, so the
    composition ablation changes only whether fresh rows are dropped. Displaced fresh rows are chosen at
    random (still inserted into the buffer by the caller: they were generated anyway).
    """
    n = len(fresh)
    replay = draw(round(n * replay_ratio / (1.0 + replay_ratio)))
    if len(replay) > n:  # a whole-group draw can overshoot
        replay = replay.select(torch.arange(n))
    keep = np.sort(rng.permutation(n)[: n - len(replay)])
    return RolloutBatch.concat([fresh.select(torch.from_numpy(keep)), replay])


def compose_batch(fresh: RolloutBatch, buffer, step: int) -> RolloutBatch:
    """Algorithm 1 steps 4-6: evict, sample, compose. `buffer` is a `ReplayBuffer`."""
    cfg = buffer.config
    fn = COMPOSITIONS.get(cfg.composition)
    return fn(fresh, lambda n: buffer.sample(n, step), cfg.replay_ratio, buffer.rng)
