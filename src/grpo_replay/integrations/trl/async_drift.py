"""`replay.max_drift` in `ReplayAsyncGRPOTrainer`, measured on TRL's own loss forward.

The samples of a step are composed a chunk ahead of the update, so the bound cannot be applied where they are drawn;
it is applied where the loss sees them. TRL's `compute_loss` forwards the packed row once and reads each loss token's
current log-prob; `bounded_loss` runs that forward (TRL's own call, stopped right after it), measures each replayed
sample's drift from those log-probs (`loss.token_drift`, the measure of every other trainer: the mean k3 over its loss
tokens), takes the samples above the bound out of the loss terms and TRL's token normaliser, and then lets TRL's loss
run on the same forward's outputs. No second forward and no copy of TRL's loss body.

A packed row names its samples by position (`segment_id`); the collator adds `SEQ_KEY`, each row's samples' buffer
insertion numbers (-1: fresh, never dropped; `PAD` past the row's last sample), so every process knows which of its
samples are replayed rows and the main process (which holds the buffer) can evict the dropped ones.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, NamedTuple

import torch

from ...loss import token_drift
from ...session import over_drift_bound
from .async_samples import BUFFER_SEQ

SEQ_KEY = "replay_buffer_seqs"  # (num_processes, S) int64 per micro-batch
PAD = -2


def row_seqs(rows) -> torch.Tensor:
    """(len(rows), S) each packed row's samples' buffer insertion numbers, in the row's sample order (TRL's
    `segment_id`); -1 for a fresh sample, `PAD` after a row's last."""
    seqs = [[int(s.get(BUFFER_SEQ, -1)) for s in row.samples] for row in rows]
    width = max(map(len, seqs), default=0)
    return torch.tensor([x + [PAD] * (width - len(x)) for x in seqs], dtype=torch.long).reshape(len(rows), width)


class Measured(NamedTuple):
    """One micro-batch's replayed samples, over every process: their insertion numbers, drift and which left."""

    seqs: torch.Tensor  # (R,) int64
    drift: torch.Tensor  # (R,) float32
    dropped: torch.Tensor  # (R,) bool


class _Forwarded(Exception):
    """Raised right after the model's forward, to stop TRL's loss once it has built the forward's inputs."""


class _OneForward:
    """The model, forwarded once: the first call runs it, keeps its outputs and stops the caller (`_Forwarded`); every
    later call returns those outputs (the autograd graph is the same one)."""

    def __init__(self, model):
        self.model, self.outputs, self.seconds = model, None, 0.0

    def __call__(self, *args: Any, **kwargs: Any):
        if self.outputs is None:
            start = time.time()
            self.outputs = self.model(*args, **kwargs)
            self.seconds = time.time() - start
            raise _Forwarded
        return self.outputs


def segment_drift(logps: torch.Tensor, behaviour: torch.Tensor, segment_id: torch.Tensor, n: int) -> torch.Tensor:
    """(n,) `token_drift` of each segment, from flat (M,) loss-token values and the segment each belongs to."""
    seg = segment_id.cpu()
    counts = torch.bincount(seg, minlength=n)
    width = int(counts.max()) if len(seg) else 0
    order = torch.argsort(seg, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    col = torch.empty_like(seg)
    col[order] = torch.arange(len(seg)) - starts[seg[order]]
    dense = torch.zeros(n, width, dtype=torch.float32)
    old = torch.zeros(n, width, dtype=torch.float32)
    mask = torch.zeros(n, width, dtype=torch.bool)
    dense[seg, col], old[seg, col], mask[seg, col] = logps.detach().float().cpu(), behaviour.float().cpu(), True
    return token_drift(dense, old, mask)


def bounded_loss(trainer, compute_loss: Callable, model, inputs: dict[str, Any], max_drift: float,
                 **kwargs: Any) -> tuple[Any, Measured]:
    """TRL's loss of one micro-batch with the replayed samples whose drift exceeds `max_drift` left out of its terms
    and its normaliser (`global_n_tokens`, all-reduced: the loss is normalised over the samples kept). Every process
    calls it (collectives). Returns the loss and, over all processes, what was measured."""
    forward = _OneForward(model)
    try:
        compute_loss(forward, inputs, **kwargs)
    except _Forwarded:
        pass
    selected = inputs["token_index"] >= 0
    seqs = inputs[SEQ_KEY].reshape(-1)
    segment_id = inputs["segment_id"][selected]
    logps = forward.outputs.log_probs.flatten()[inputs["token_index"][selected]]
    drift = segment_drift(logps, inputs["old_log_probs"][selected], segment_id, len(seqs))
    dropped = over_drift_bound(seqs.cpu() >= 0, drift, max_drift)
    leave = dropped.to(segment_id.device)[segment_id]
    accel = trainer.accelerator
    n_left = accel.reduce(leave.sum().float().reshape(1), reduction="sum")
    inputs = dict(inputs)
    if bool(leave.any()):
        if bool(leave.all()):  # no loss term would remain on this process: keep them at advantage 0 (no gradient)
            adv = inputs["advantages"].clone()
            adv[selected] = torch.where(leave, 0.0, adv[selected])
            inputs["advantages"] = adv
        else:
            index = inputs["token_index"].clone()
            index[selected] = torch.where(leave, -1, index[selected])
            inputs["token_index"] = index
    inputs["global_n_tokens"] = inputs["global_n_tokens"] - n_left.to(inputs["global_n_tokens"])
    loss = compute_loss(forward, inputs, **kwargs)
    # TRL timed the second call's (stored) forward; the step's forward time is the real one.
    trainer._step_forward_s += forward.seconds - trainer._last_forward_time_s
    trainer._last_forward_time_s = forward.seconds
    own = torch.stack([seqs.double(), drift.double().to(seqs.device), dropped.double().to(seqs.device)], dim=1)
    gathered = accel.gather(own)  # (processes x S, 3): every row's samples, in the collator's order
    replayed = gathered[:, 0] >= 0
    measured = Measured(gathered[replayed, 0].long().cpu(), gathered[replayed, 1].float().cpu(),
                        gathered[replayed, 2].bool().cpu())
    return loss, measured


def reached_loss(samples: list[dict[str, Any]], measured: list[Measured]) -> list[dict[str, Any]]:
    """The samples of a step that reached the loss: `samples` less one replayed sample per dropped insertion number
    of `measured` (a row drawn twice and dropped twice leaves twice)."""
    left = Counter(int(s) for m in measured for s in m.seqs[m.dropped].tolist())
    kept = []
    for s in samples:
        seq = int(s.get(BUFFER_SEQ, -1))
        if seq >= 0 and left[seq]:
            left[seq] -= 1
        else:
            kept.append(s)
    return kept
