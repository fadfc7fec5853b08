"""Diagnostics split by fresh vs replay rows of a composed batch."""
from __future__ import annotations

from typing import Any

import torch

from . import metric_names as mn
from .rollout import RolloutBatch


def split_metrics(batch: RolloutBatch, step: int, stats: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """count, mean |A|, mean reward, ratio mean/max, clip fraction (per token) for fresh and replay rows,
    replay share, replay age mean/max and histogram (index = age). A kind without rows gets its count only."""
    out: dict[str, Any] = {}
    n = len(batch)
    is_rep = batch.is_replay.cpu()
    out[mn.REPLAY_SHARE] = float(is_rep.float().mean()) if n else 0.0
    for name, rows in (("fresh", ~is_rep), ("replay", is_rep)):
        k = int(rows.sum())
        out[f"{name}/count"] = k
        if not k:
            # No rows of this kind (replay before its warm-up): a ratio of 1.0 or an age of 0 written here would be
            # averaged into every curve and mean over steps as if replay had been on-policy; the count alone says it.
            continue
        out[f"{name}/abs_adv"] = float(batch.advantages[rows].abs().mean())
        out[f"{name}/reward"] = float(batch.rewards[rows].float().mean())
        if stats is not None:
            m = stats["mask"][rows].cpu()
            r = stats["ratio"][rows].cpu()[m]
            c = stats["clipped"][rows].cpu()[m]
            if r.numel():
                out[f"{name}/ratio_mean"] = float(r.mean())
                out[f"{name}/ratio_max"] = float(r.max())
                out[f"{name}/clip_frac"] = float(c.float().mean())
    ages = batch.age(step)[is_rep].cpu()
    if ages.numel():
        out[mn.REPLAY_AGE_MEAN] = float(ages.float().mean())
        out[mn.REPLAY_AGE_MAX] = int(ages.max())
        out[mn.REPLAY_AGE_HIST] = torch.bincount(ages.clamp(min=0)).tolist()
    return out
