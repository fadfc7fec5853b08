"""`replay.max_drift` in the built-in trainer: measure each replayed row's drift on the update's own forward
pass, mask the rows above the bound out of the loss, and renormalise the accumulated gradient so that it is
the loss over the rows kept (as if the dropped rows had never been in the batch).

The measure is `loss.replay_drift` (mean per-token k3 estimate of KL(behaviour || current)); it costs no
extra forward pass. Which rows are above the bound is the core's `session.over_drift_bound`, as in every engine.
The loop has the session evict the dropped rows (`ReplaySession.evict_drifted`) and log them (`Tally`).
"""
from __future__ import annotations

import torch

from ..loss import replay_drift
from ..rollout import RolloutBatch
from ..session import over_drift_bound


class DriftBound:
    """One update's drift bookkeeping: `apply` per micro-batch (after its forward pass, before its loss),
    `finish` once after the last backward, `stats` for the update's result."""

    def __init__(self, bound: float):
        self.bound = bound
        self.drift: list[torch.Tensor] = []  # (b,) per micro-batch
        self.dropped: list[torch.Tensor] = []  # (b,) bool
        self.tokens: list[torch.Tensor] = []  # (b,) counted tokens per row before masking

    def apply(self, part: RolloutBatch, logps: torch.Tensor) -> RolloutBatch:
        """`part` with the completion masks of its replayed rows above the bound zeroed. Fresh rows are never
        dropped (their drift is 0: these parameters generated them)."""
        self.tokens.append(part.completion_mask.ne(0).sum(1).cpu())
        drift = replay_drift(logps, part)
        dropped = over_drift_bound(part.is_replay, drift, self.bound).to(drift.device)
        if bool(dropped.any()):
            # a field replaced, not written in place: the micro-batch's tensors are views of the composed batch's
            part.completion_mask = part.completion_mask.ne(0) & ~dropped.unsqueeze(1)
        self.drift.append(drift.cpu())
        self.dropped.append(dropped.cpu())
        return part

    def finish(self, model, aggregation: str) -> tuple[float, bool]:
        """Scale the accumulated gradients to those of the loss over the kept rows only; returns (factor,
        anything kept). The micro-batch weights were shares of the whole batch's tokens (token_mean) or rows
        (the others) and the dropped rows contributed 0, so one factor corrects every gradient exactly."""
        drop = torch.cat(self.dropped)
        if not bool(drop.any()):
            return 1.0, True
        if aggregation == "token_mean":
            total = float(sum(t.sum() for t in self.tokens))
            kept = total - float(sum(t[d].sum() for t, d in zip(self.tokens, self.dropped)))
        else:
            total, kept = float(len(drop)), float((~drop).sum())
        if kept == 0:
            return 0.0, False
        factor = total / kept
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)
        return factor, True

    def stats(self) -> dict[str, torch.Tensor]:
        return {"drift": torch.cat(self.drift), "drift_dropped": torch.cat(self.dropped)}
