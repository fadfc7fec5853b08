"""Scoring tokens: log pi(completion token | prefix) of completions under the current policy, in one forward pass
(prompts left-padded, completions right-padded). Sampling lives in `grpo_replay.generation`."""
from __future__ import annotations

import torch

from ..rollout import mask_lengths


def completion_logits(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(B, C, V) float32 logits / temperature: position t is the distribution of completion token t given its prefix."""
    device = next(model.parameters()).device
    # Ids and masks may arrive narrow (int32, bool: rollout.py); the model and torch.gather get int64.
    ids = torch.cat([prompt_ids, completion_ids], 1).to(device).long()  # (B, P + C)
    # Attend to real prompt tokens and every completion position up to the last counted one.
    comp_real = (torch.arange(completion_ids.shape[1]).unsqueeze(0) < mask_lengths(completion_mask.cpu()).unsqueeze(1)).long()
    attn = torch.cat([prompt_mask.ne(0).long(), comp_real], 1).to(device)  # (B, P + C)
    pos = (attn.cumsum(1) - 1).clamp(min=0)  # (B, P + C) positions skip the left padding
    P, C = prompt_ids.shape[1], completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits  # (B, P+C, V)
    return logits[:, P - 1 : P + C - 1].float() / temperature  # (B, C, V): position t predicts token t+1


def token_logps(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(B, C) log pi(completion token | prefix) at `temperature`; padding positions hold 0."""
    logits = completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature)  # (B, C, V)
    tok = completion_ids.to(logits.device).long().unsqueeze(-1)  # (B, C, 1)
    logp = logits.gather(-1, tok).squeeze(-1) - torch.logsumexp(logits, -1)  # (B, C)
    return logp * completion_mask.to(logits.device)
