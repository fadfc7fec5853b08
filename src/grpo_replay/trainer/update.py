"""The built-in trainer's update (Algorithm 1, step 6): `TrainConfig.update_epochs` (mu) optimizer updates on one
step's composed batch, each accumulated over its micro-batches.

Pass 1 reads the fresh rows' behaviour log-probs off its own forward pass (the parameters that generated them
have not moved yet), so with mu = 1 the update is one PPO-clip step whose fresh ratios are exactly 1. Passes
2..mu run the same micro-batches in the same order (no reshuffle: micro_batch_size is a memory setting, not an
algorithmic one) against the same behaviour log-probs, pass 1's for the fresh rows and the stored ones for the
replayed rows, so the clip acts on the fresh rows from pass 2 on. This is the GRPO paper's mu (TRL's
`num_iterations`, verl's `ppo_epochs` with one mini-batch).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Optional

import torch

from ..loss import LossConfig, ppo_clip_loss
from ..rollout import RolloutBatch, cat_padded
from .drift_bound import DriftBound
from .logprobs import token_logps
from .memory import precision_of


def forward_precision(model, cfg) -> contextlib.AbstractContextManager:
    """The forward passes' precision (`TrainConfig.precision`): bf16 autocast on a GPU by default, the float32
    weights, gradients and AdamW state staying the master copy; plain float32 on a CPU."""
    device = next(model.parameters()).device
    if precision_of(cfg, device.type) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def update(model, optimizer, scheduler, batch: RolloutBatch, loss_cfg: LossConfig, cfg) -> dict[str, Any]:
    """`cfg.update_epochs` optimizer updates on `batch` (`cfg` a TrainConfig); the learning-rate schedule advances
    once, after them, so lr_warmup_steps counts steps whatever mu is.

    Returns the learning rate the passes used (`lr`), pass 1's loss, grad_norm, token_stats ((B, C) ratio / clipped / mask [/ kl]) and fresh_logps
    ((n_fresh, C) behaviour log-probs of the fresh rows); `finite`: pass 1 was finite, i.e. the step made its
    update (its fresh rows, measured by pass 1, can enter the buffer); under replay.max_drift, pass 1's per-row
    drift and the rows any pass dropped; with mu > 1, `epochs`: per pass run the clip fraction and the
    approximate KL (mean per-token k3 of the ratio) over the counted tokens. A non-finite pass makes no
    optimizer step and ends the step's passes; when it is a later pass k > 1, `nonfinite_pass` = k (the
    earlier passes' updates stand)."""
    behaviour: Optional[list[torch.Tensor]] = None
    passes: list[dict[str, Any]] = []
    for _ in range(cfg.update_epochs):
        res, behaviour = _pass(model, optimizer, batch, loss_cfg, cfg, behaviour)
        passes.append(res)
        if not (res["finite"] and res["kept_any"]):  # no optimizer step: the later passes would repeat this one
            break
    first = passes[0]
    lr = scheduler.get_last_lr()[0]  # the rate every pass used, before the schedule advances
    if first["finite"] and first["kept_any"]:
        scheduler.step()
    out = {
        "loss": first["loss"], "grad_norm": first["grad_norm"], "finite": first["finite"], "lr": lr,
        "fresh_logps": first["fresh_logps"], "token_stats": first["token_stats"],
    }
    if first["finite"] and not passes[-1]["finite"]:
        out["nonfinite_pass"] = len(passes)
    if "drift" in first:  # replay.max_drift: a row dropped by any pass is evicted
        dropped = first["drift_dropped"]
        for p in passes[1:]:
            dropped = dropped | p["drift_dropped"]
        out.update(drift=first["drift"], drift_dropped=dropped)
    if cfg.update_epochs > 1:
        out["epochs"] = [_pass_stats(p["token_stats"]) for p in passes]
    return out


def _pass(model, optimizer, batch: RolloutBatch, loss_cfg: LossConfig, cfg,
          behaviour: Optional[list[torch.Tensor]]) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """One optimizer step on the composed batch, accumulated over micro-batches.

    Each micro-batch's loss is weighted by its share of the normaliser (tokens for token_mean, rows
    otherwise), so the accumulated gradient equals the whole-batch loss's gradient. Micro-batches are cut
    from each segment of the composed batch (fresh rows, then replay rows: `ComposedBatch.micro_batches`),
    as views: the segments are never copied into one batch, and each is padded only to its own width. So
    without micro_batch_size a fresh-anchored update is two forward passes, the fresh rows and the replay
    rows. dr_grpo's normaliser stays the whole update's completion width.

    `behaviour`: None on pass 1 (the fresh rows' behaviour log-probs are read off this forward pass), else
    pass 1's per-micro-batch (b, C) behaviour log-probs. Returns the pass's result and those log-probs."""
    B = len(batch)
    device = next(model.parameters()).device
    micro = list(batch.micro_batches(cfg.micro_batch_size))
    total_tokens = sum(p.completion_mask.sum() for p in micro).clamp(min=1).to(device)
    width = batch.completion_width()
    if loss_cfg.max_completion_length is None and width > 0:
        loss_cfg = dataclasses.replace(loss_cfg, max_completion_length=width)
    optimizer.zero_grad(set_to_none=True)
    logps_all, stats_all, used, loss_sum = [], [], [], 0.0
    bound = DriftBound(cfg.replay.max_drift) if cfg.replay.max_drift is not None else None
    for i, part in enumerate(micro):
        part = part.to(device)  # the loss needs every tensor on the model's device
        with forward_precision(model, cfg):
            logps = token_logps(model, part.prompt_ids, part.prompt_mask, part.completion_ids, part.completion_mask,
                                cfg.temperature)  # (b, C) float32
        if behaviour is None:
            # Fresh rows were generated by the current parameters: their behaviour log-probs are these values.
            fresh_rows = ~part.is_replay
            part.behaviour_logps = torch.where(fresh_rows.unsqueeze(1), logps.detach(), part.behaviour_logps)
        else:
            part.behaviour_logps = behaviour[i]
        used.append(part.behaviour_logps)
        part = bound.apply(part, logps) if bound is not None else part  # replay.max_drift: drifted rows leave the loss
        loss, st = ppo_clip_loss(logps, part, loss_cfg)
        weight = (part.completion_mask.sum() / total_tokens) if loss_cfg.aggregation == "token_mean" else len(part) / B
        (loss * weight).backward()
        loss_sum += float(loss.detach()) * float(weight)
        logps_all.append(logps.detach().cpu())
        stats_all.append({k: v.cpu() for k, v in st.items()})
    factor, kept_any = bound.finish(model, loss_cfg.aggregation) if bound is not None else (1.0, True)
    loss_sum *= factor
    finite = math.isfinite(loss_sum)
    grad_norm = None
    if finite and kept_any:
        params = [p for p in model.parameters() if p.grad is not None]
        # max_norm=inf measures the norm (to catch NaN/inf gradients) without scaling: clipping disabled.
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf))
        finite = math.isfinite(grad_norm)
    if finite and kept_any:  # every row dropped for drift: nothing to learn from, like an all-filtered step
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    # (B, C): segments have their own widths; padding positions read as the loss's own padding does
    logps = cat_padded(logps_all, left=False, value=0.0)
    token_stats = {k: cat_padded([s[k] for s in stats_all], left=False, value=1.0 if k == "ratio" else 0)
                   for k in stats_all[0]}
    return {
        "loss": loss_sum if finite and kept_any else None,
        "grad_norm": grad_norm,
        "finite": finite,
        "kept_any": kept_any,
        "fresh_logps": logps[~batch.is_replay],
        "token_stats": token_stats,
        **(bound.stats() if bound is not None else {}),
    }, used


def _pass_stats(token_stats: dict[str, torch.Tensor]) -> dict[str, float]:
    """One pass's clip fraction and approximate KL(behaviour || current): the mean over counted tokens of
    `clipped` and of the k3 estimate ratio - 1 - log(ratio) (>= 0; 0 when every ratio is 1)."""
    m = token_stats["mask"]
    if not bool(m.any()):
        return {"clip_frac": 0.0, "approx_kl": 0.0}
    r = token_stats["ratio"][m].double()
    return {"clip_frac": float(token_stats["clipped"][m].float().mean()), "approx_kl": float((r - 1 - r.log()).mean())}


def epoch_metrics(stats: Optional[dict[str, Any]], mu: int) -> dict[str, Any]:
    """The metrics row's per-pass columns when update_epochs > 1: epochs/clip_frac_{k} and epochs/approx_kl_{k}
    for k = 1..mu (absent for a pass that did not run: the step made no update, or an earlier pass was not
    finite), epochs/passes, the passes run, and epochs/nonfinite_pass, the later pass that went non-finite (its
    optimizer step not made; absent when none did)."""
    if mu <= 1:
        return {}
    passes = stats.get("epochs", []) if stats is not None else []
    out: dict[str, Any] = {"epochs/passes": len(passes)}
    if stats is not None and "nonfinite_pass" in stats:
        out["epochs/nonfinite_pass"] = stats["nonfinite_pass"]
    for k, p in enumerate(passes, 1):
        out[f"epochs/clip_frac_{k}"] = p["clip_frac"]
        out[f"epochs/approx_kl_{k}"] = p["approx_kl"]
    return out
