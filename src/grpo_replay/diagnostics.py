"""Diagnostics split by fresh vs replay rows of a composed batch."""
from __future__ import annotations

from typing import Any, Optional

import torch

from .rollout import RolloutBatch
from .tally import KINDS, Tally


def split_tally(batch: RolloutBatch, step: int, stats: Optional[dict[str, torch.Tensor]] = None, **kw: Any) -> Tally:
    """`Tally.of(batch, step, **kw)` with the PPO-clip statistics of `stats` ((B, C) ratio / clipped / mask, the
    loss's token statistics) by kind."""
    t = Tally.of(batch, step, **kw)
    if stats is not None:
        rep = batch.is_replay.cpu()
        for kind, rows in zip(KINDS, (~rep, rep)):
            if bool(rows.any()):
                t.add_clip(kind, stats["ratio"][rows].cpu(), stats["clipped"][rows].cpu(), stats["mask"][rows].cpu())
    return t


def split_metrics(batch: RolloutBatch, step: int, stats: Optional[dict[str, torch.Tensor]] = None) -> dict[str, Any]:
    """count, mean |A|, mean reward, ratio mean/max, clip fraction (per token) for fresh and replay rows,
    replay share, replay age mean/max and histogram (index = age). A kind without rows gets its count only."""
    return split_tally(batch, step, stats).metrics()
