"""The replay-aware GRPO policy loss: PPO-clip over a composed batch with stored behaviour log-probs.

ratio = exp(log pi_theta - log pi_behaviour) per token, where pi_behaviour is the policy that generated the
row (for a replayed row: the policy at its birth step). docs/method.md: ordinary clipping, no extra importance
weight; age eviction is what bounds the ratio's drift.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .validation import bad, is_finite, is_int
from .registry import Registry
from .rollout import RolloutBatch, check_completion_mask

AggregationFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
AGGREGATIONS: Registry[AggregationFn] = Registry("loss aggregation", params=("per_token", "mask", "max_len"))


@AGGREGATIONS.register("token_mean")
def token_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """Sum over all counted tokens / their number (DAPO): long completions weigh by their length."""
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


@AGGREGATIONS.register("seq_mean")
def seq_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """Mean over rows of each row's token mean (original GRPO)."""
    per_row = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B,)
    return per_row.mean()


@AGGREGATIONS.register("dr_grpo")
def dr_grpo(per_token: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """Sum over counted tokens / (rows * max_len) (Dr.GRPO): a constant normaliser, no length bias."""
    return (per_token * mask).sum() / (per_token.shape[0] * max_len)


@dataclass(frozen=True)
class LossConfig:
    """PPO-clip settings (the method's defaults, docs/method.md)."""

    eps_low: float = 0.2
    """Lower clip: ratio >= 1 - eps_low."""
    eps_high: float = 0.28
    """Upper clip (clip-higher): ratio <= 1 + eps_high."""
    dual_clip_c: Optional[float] = 10.0
    """Dual clip for negative advantages: per-token loss <= c * |A|; None disables. Must be > 1."""
    aggregation: str = "token_mean"
    """token_mean | seq_mean | dr_grpo."""
    beta: float = 0.0
    """KL coefficient to the reference policy (k3 estimator); 0 = no KL term, no reference model needed."""
    max_completion_length: Optional[int] = None
    """Normaliser for dr_grpo; defaults to the batch's completion width."""

    def __post_init__(self) -> None:
        # is_finite first: a string would raise a bare TypeError in the comparison, a NaN passes every one.
        if not is_finite(self.eps_low) or not 0 <= self.eps_low < 1:
            bad(self, "eps_low", "a finite number, 0 <= eps_low < 1")
        if not is_finite(self.eps_high) or self.eps_high < 0:
            bad(self, "eps_high", "a finite number >= 0")
        if self.dual_clip_c is not None and (not is_finite(self.dual_clip_c) or self.dual_clip_c <= 1):
            bad(self, "dual_clip_c", "a finite number > 1 or None")
        if self.aggregation not in AGGREGATIONS:
            bad(self, "aggregation", ", ".join(AGGREGATIONS.names()))
        if not is_finite(self.beta) or self.beta < 0:
            bad(self, "beta", "a finite number >= 0")
        if self.max_completion_length is not None and (not is_int(self.max_completion_length) or self.max_completion_length < 1):
            bad(self, "max_completion_length", "an integer >= 1 or None")

def ppo_clip_loss(
    logps: torch.Tensor, batch: RolloutBatch, cfg: LossConfig = LossConfig()
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss over a composed batch and per-token diagnostics.

    logps: exactly (B, C) log pi_theta of batch.completion_ids (with grad), B = len(batch), C its completion
    width; batch.completion_mask must hold only 0 and 1 (or be bool). Positions with mask 0 do not influence
    the loss or its gradient, whatever logps, behaviour or reference log-probs hold there (-inf, NaN).
    Returns (scalar loss, stats) where stats holds (B, C) tensors `ratio`, `clipped` (bool: the clip was
    active), `mask` and, if beta > 0, `kl`. Raises ValueError for any other shape or mask value.
    """
    _check_inputs(logps, batch, cfg)
    counted = batch.completion_mask.ne(0)  # (B, C) bool
    mask = counted.to(logps.dtype)  # (B, C)
    old = batch.behaviour_logps.to(logps.dtype)  # (B, C)
    adv = batch.advantages.to(logps.dtype).unsqueeze(1)  # (B, 1)
    # where, not a product: a -inf behaviour log-prob at padding times 0 would be NaN
    log_ratio = torch.where(counted, logps - old, 0.0)  # (B, C); zero at padding keeps exp() finite there
    ratio = torch.exp(log_ratio)  # (B, C)
    clipped_ratio = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)  # (B, C)
    loss1 = -adv * ratio  # (B, C)
    loss2 = -adv * clipped_ratio  # (B, C)
    per_token = torch.maximum(loss1, loss2)  # (B, C) pessimistic PPO bound
    clipped = loss2 > loss1  # (B, C)
    if cfg.dual_clip_c is not None:
        # For A < 0 a huge ratio makes -A*ratio unbounded; cap the loss at -c*A (Ye et al. 2020).
        cap = -adv * cfg.dual_clip_c  # (B, 1)
        dual = (adv < 0) & (per_token > cap)  # (B, C)
        per_token = torch.where(dual, cap.expand_as(per_token), per_token)
        clipped = clipped | dual
    stats = {"ratio": ratio.detach(), "clipped": clipped & counted, "mask": counted}
    if cfg.beta > 0:
        d = torch.where(counted, batch.ref_logps.to(logps.dtype) - logps, 0.0)  # (B, C)
        kl = torch.exp(d) - d - 1  # (B, C) k3 estimator, >= 0
        per_token = per_token + cfg.beta * kl
        stats["kl"] = kl.detach()
    max_len = cfg.max_completion_length or mask.shape[1]
    loss = AGGREGATIONS.get(cfg.aggregation)(per_token, mask, max_len)
    return loss, stats


def _check_inputs(logps: torch.Tensor, batch: RolloutBatch, cfg: LossConfig) -> None:
    """Raise ValueError unless every (B, C) input has exactly that shape (a (B, 1) or (C,) tensor would
    broadcast to a plausible wrong loss) and the completion mask is 0/1."""
    want = (len(batch), batch.completion_width())
    fields = {"logps": logps, "batch.completion_mask": batch.completion_mask, "batch.behaviour_logps": batch.behaviour_logps}
    if cfg.beta > 0:
        if batch.ref_logps is None:
            raise ValueError("LossConfig.beta > 0 needs batch.ref_logps (reference log-probs)")
        fields["batch.ref_logps"] = batch.ref_logps
    for name, t in fields.items():
        if tuple(t.shape) != want:
            raise ValueError(f"ppo_clip_loss: {name} has shape {tuple(t.shape)}; allowed: exactly {want} (rows, completion width)")
    check_completion_mask(batch.completion_mask, "ppo_clip_loss")


def replay_drift(logps: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    """(B,) each replayed row's drift from the current policy: the mean over its counted tokens of the k3
    estimate of KL(behaviour || current), exp(d) - 1 - d with d = log pi_theta - log pi_behaviour (>= 0, and
    unbiased for that KL on tokens sampled from the behaviour policy, as a stored row's are). 0 for fresh rows
    and for rows without counted tokens. `logps` is the update's own (B, C) forward pass (no extra pass);
    no gradient flows through the result. `ReplayConfig.max_drift` bounds it (docs/method.md)."""
    per_row = token_drift(logps, batch.behaviour_logps, batch.completion_mask)
    return torch.where(batch.is_replay.to(per_row.device), per_row, 0.0)


def token_drift(logps: torch.Tensor, behaviour_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) the mean over each row's counted tokens (`mask` nonzero) of exp(d) - 1 - d, d = logps - behaviour_logps,
    each (B, C): `replay_drift` for rows an engine holds in its own layout (0 for a row without counted tokens)."""
    counted = mask.ne(0)
    d = torch.where(counted, logps.detach() - behaviour_logps.to(logps.dtype), 0.0)  # (B, C)
    k3 = torch.where(counted, torch.expm1(d) - d, 0.0)
    return k3.sum(1) / counted.sum(1).clamp(min=1)
