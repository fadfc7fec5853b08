"""Diagnostics split by fresh vs replay rows of a composed batch."""
from __future__ import annotations

from typing import Any

import torch

from .rollout import RolloutBatch


def split_metrics(batch: RolloutBatch, step: int, stats: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """count, mean |A|, mean reward, ratio mean/max, clip fraction (per token) for fresh and replay rows,
    replay share, replay age mean/max and histogram (index = age)."""
    out: dict[str, Any] = {}
    n = len(batch)
    is_rep = batch.is_replay.cpu()
    out["replay/share"] = float(is_rep.float().mean()) if n else 0.0
    for name, rows in (("fresh", ~is_rep), ("replay", is_rep)):
        k = int(rows.sum())
        out[f"{name}/count"] = k
        out[f"{name}/abs_adv"] = float(batch.advantages[rows].abs().mean()) if k else 0.0
        out[f"{name}/reward"] = float(batch.rewards[rows].float().mean()) if k else 0.0
        if stats is not None:
            m = stats["mask"][rows].cpu()
            r = stats["ratio"][rows].cpu()[m]
            c = stats["clipped"][rows].cpu()[m]
            out[f"{name}/ratio_mean"] = float(r.mean()) if r.numel() else 1.0
            out[f"{name}/ratio_max"] = float(r.max()) if r.numel() else 1.0
            out[f"{name}/clip_frac"] = float(c.float().mean()) if c.numel() else 0.0
    ages = batch.age(step)[is_rep].cpu()
    out["replay/age_mean"] = float(ages.float().mean()) if ages.numel() else 0.0
    out["replay/age_max"] = int(ages.max()) if ages.numel() else 0
    out["replay/age_hist"] = torch.bincount(ages.clamp(min=0)).tolist() if ages.numel() else []
    return out
