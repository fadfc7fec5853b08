"""Scoring tokens: log pi(completion token | prefix) of completions under the current policy, in one forward pass
(prompts left-padded, completions right-padded). Sampling lives in `grpo_replay.generation`.

Memory: the full logits of a batch are (B, P + C, V); for Qwen3 (V = 151,936) at 16 rows x 4,096 tokens that is
40 GB in float32 alone, kept for the backward pass with its copies. `token_logps` therefore runs the model's decoder
(transformers' `get_decoder()`), keeps the hidden states of the completion's counted positions only, and applies the
output head and the log-softmax `chunk_bytes` of float32 logits at a time, each chunk checkpointed (recomputed in the
backward pass), so what the backward pass keeps is the (T, H) hidden states, not (T, V) logits. When the whole
batch's logits fit in one chunk (the testbed, the CPU runs) it is the plain forward pass, unchanged.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint

from ..rollout import mask_lengths

CHUNK_BYTES = 512 << 20  # float32 logits per chunk of the head + log-softmax (a few of these live at once)
# Config fields of models whose head is more than a linear map of the decoder's output (softcapping, scaling):
# these keep the model's own forward.
_HEAD_EXTRAS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _inputs(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> dict:
    device = next(model.parameters()).device
    # Ids and masks may arrive narrow (int32, bool: rollout.py); the model and torch.gather get int64.
    ids = torch.cat([prompt_ids, completion_ids], 1).to(device).long()  # (B, P + C)
    # Attend to real prompt tokens and every completion position up to the last counted one.
    comp_real = (torch.arange(completion_ids.shape[1]).unsqueeze(0) < mask_lengths(completion_mask.cpu()).unsqueeze(1)).long()
    attn = torch.cat([prompt_mask.ne(0).long(), comp_real], 1).to(device)  # (B, P + C)
    pos = (attn.cumsum(1) - 1).clamp(min=0)  # (B, P + C) positions skip the left padding
    return {"input_ids": ids, "attention_mask": attn, "position_ids": pos, "use_cache": False}


def completion_logits(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(B, C, V) float32 logits / temperature: position t is the distribution of completion token t given its prefix."""
    P, C = prompt_ids.shape[1], completion_ids.shape[1]
    logits = model(**_inputs(model, prompt_ids, prompt_mask, completion_ids, completion_mask)).logits  # (B, P+C, V)
    return logits[:, P - 1 : P + C - 1].float() / temperature  # (B, C, V): position t predicts token t+1


def split_head(model) -> Optional[tuple[torch.nn.Module, torch.nn.Module]]:
    """(decoder, output head) when logits = head(decoder(...).last_hidden_state), else None (the model's own
    forward is used)."""
    get_decoder, head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", lambda: None)()
    decoder = get_decoder() if callable(get_decoder) else None
    config = getattr(model, "config", None)
    if decoder is None or decoder is model or not isinstance(head, torch.nn.Linear) or config is None:
        return None
    if any(getattr(config, k, None) not in (None, 1, 1.0) for k in _HEAD_EXTRAS):
        return None
    return decoder, head


def _chunk_logps(head: torch.nn.Module, hidden: torch.Tensor, tok: torch.Tensor, temperature: float) -> torch.Tensor:
    """(n,) log-probs of tokens tok (n,) from hidden states (n, H): the head's float32 logits, then log-softmax."""
    logits = head(hidden).float() / temperature  # (n, V)
    return logits.gather(-1, tok.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)


def token_logps(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    chunk_bytes: int = CHUNK_BYTES,
) -> torch.Tensor:
    """(B, C) log pi(completion token | prefix) at `temperature`; padding positions hold 0.

    Only the completion positions whose mask is non-zero are scored, `chunk_bytes` of float32 logits at a time (see
    the module docstring); the values equal the full-logits computation up to float rounding."""
    B, P = prompt_ids.shape
    C = completion_ids.shape[1]
    parts = split_head(model)
    vocab = parts[1].out_features if parts else None
    if parts is None or B * (P + C) * vocab * 4 <= chunk_bytes:
        logits = completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature)  # (B, C, V)
        tok = completion_ids.to(logits.device).long().unsqueeze(-1)  # (B, C, 1)
        logp = logits.gather(-1, tok).squeeze(-1) - torch.logsumexp(logits, -1)  # (B, C)
        return logp * completion_mask.to(logits.device)
    decoder, head = parts
    hidden = decoder(**_inputs(model, prompt_ids, prompt_mask, completion_ids, completion_mask)).last_hidden_state
    mask = completion_mask.to(hidden.device)  # (B, C)
    keep = mask.ne(0)
    h = hidden[:, P - 1 : P + C - 1][keep]  # (T, H): position t predicts completion token t
    tok = completion_ids.to(hidden.device).long()[keep]  # (T,)
    n = chunk_tokens(vocab, chunk_bytes)
    grad = torch.is_grad_enabled() and h.requires_grad
    pieces = [
        checkpoint(_chunk_logps, head, h[i : i + n], tok[i : i + n], temperature, use_reentrant=False) if grad
        else _chunk_logps(head, h[i : i + n], tok[i : i + n], temperature)
        for i in range(0, h.shape[0], n)
    ]
    out = torch.zeros(B, C, dtype=torch.float32, device=hidden.device)
    if pieces:
        out = out.masked_scatter(keep, torch.cat(pieces))
    return out * mask


def chunk_tokens(vocab: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Tokens per chunk of `token_logps` for a vocabulary of `vocab`."""
    return max(1, chunk_bytes // (vocab * 4))
