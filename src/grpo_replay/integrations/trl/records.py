"""The typed records `ReplayGRPOTrainer` passes between its hooks.

- `QueuedGeneration`: one generation's fresh rows on their way into the replay buffer. Queued when the
  generation's batch is composed, given their behaviour log-probs by the update's forward (or a pass of their
  own), inserted at the end of the accumulation window.
- `LossCapture`: what `_compute_loss` hands to the forward it runs (`_get_per_token_logps_and_entropies`), and
  what that forward hands back: its detached log-probs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ...rollout import RolloutBatch
from ...step_metrics import ReplayRecord


@dataclass
class QueuedGeneration:
    batch: RolloutBatch
    """(Q, ...) the generation's fresh non-zero-variance rows with a completion token; `behaviour_logps` (Q, C)
    is filled in as the update measures them."""
    rows: torch.Tensor
    """(Q,) long: each queued row's index in TRL's batch of the generation (this process's rows)."""
    step: int
    """The optimizer step of the generation: the rows' birth step."""
    aligned: bool
    """Generation aligned with the optimizer step: TRL computed no old log-probs, so the update's own forward
    provides the behaviour log-probs."""
    missing: torch.Tensor
    """(Q,) bool: rows still without their behaviour log-probs (all of them at first when `aligned`, else none)."""
    history: Optional[ReplayRecord] = None
    """The generation's `replay_history` record, completed with `inserted` and `buffer_size` when it is flushed."""
    inserted: int = 0
    """Rows the buffer took at the flush."""


@dataclass
class LossCapture:
    inputs: dict[str, Any]
    """The micro-batch TRL's loss reads (a copy: `old_per_token_logps` may be replaced in it)."""
    is_replay: torch.Tensor
    """(B,) bool: which rows of the micro-batch are replay rows."""
    row_id: Optional[torch.Tensor]
    """(B,) long: a fresh row's index in its generation's queued rows (-1: not queued, or a replay row); None
    unless the behaviour log-probs come from this forward."""
    logps: Optional[torch.Tensor] = None
    """(B, C) the loss's own forward's detached log-probs, once it ran."""
