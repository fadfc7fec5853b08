"""The typed record `ReplayGRPOTrainer` passes between its hooks (a generation's fresh rows on their way into the
buffer are the session's `Deferred` handle).

- `LossCapture`: what `_compute_loss` hands to the forward it runs (`_get_per_token_logps_and_entropies`), and
  what that forward hands back: its detached log-probs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch


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
