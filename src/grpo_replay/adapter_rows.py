"""What every engine adapter reads off the engine's rows, or hands back to it, beside the session.

- `prompt_key`: a prompt's stable identity (the buffer's `prompt_key` column), the same across steps, runs and
  trainers, for an engine whose own group id is fresh each step (verl's `uid` is a new uuid per step);
- `row_advantages`: the one advantage A_i of each row, from an engine that broadcasts it over the response tokens
  (verl's (B, R) token-level advantages), refusing a row whose advantages vary over its tokens (GAE);
- `token_rows`: replay rows as the padded token tensors a forward pass reads, padding positions holding the pad id
  and the completion mask the attention over each row's length (the TRL trainers' forward and batch).
"""
from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np
import torch

from .rollout import RolloutBatch

TOKEN_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
"""The keys `token_rows` returns (the RolloutBatch fields a forward pass over the rows reads)."""


def prompt_key(token_ids) -> int:
    """Stable 63-bit identity of a prompt: blake2b of its unpadded token ids as int64 (a numpy array or a
    tensor, any integer dtype; the same across steps, runs and trainers)."""
    if isinstance(token_ids, torch.Tensor):
        token_ids = token_ids.cpu().numpy()
    h = hashlib.blake2b(np.ascontiguousarray(token_ids, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFF_FFFF_FFFF_FFFF


def row_advantages(advantages: torch.Tensor, response_mask: torch.Tensor, atol: float = 1e-4) -> torch.Tensor:
    """(B,) float32 per-row advantage A_i from token-level (B, R) `advantages` over the (B, R) `response_mask`
    (a row without a counted token gets 0).

    Outcome estimators (GRPO, RLOO, REINFORCE++-baseline, ...) broadcast one value over the response; a row whose
    advantages vary over its response tokens (GAE) cannot be stored as a rollout with one A_i: ValueError naming
    the first such rows.
    """
    m = response_mask.float()
    if m.shape[1] == 0:
        return torch.zeros(m.shape[0], dtype=torch.float32)
    first = m.argmax(-1)  # the value at the first counted token, exactly (a masked mean would round)
    a = advantages.float().gather(1, first[:, None]).squeeze(1) * (m.sum(-1) > 0)
    dev = ((advantages.float() - a[:, None]).abs() * m).amax(-1)
    if bool((dev > atol * (1 + a.abs())).any()):
        bad = torch.nonzero(dev > atol * (1 + a.abs())).flatten()[:5].tolist()
        raise ValueError(
            "token-level advantages vary over the response tokens of rows "
            f"{bad}: replay stores one advantage per rollout and supports outcome estimators (grpo, rloo, ...) only"
        )
    return a


def token_rows(rows: RolloutBatch, pad_id: Optional[int] = None) -> dict[str, torch.Tensor]:
    """`rows` as TOKEN_KEYS, long: (B, P) prompt ids and mask, (B, C) completion ids and a completion mask that is
    the attention over each row's length (a loss mask with holes, multi-turn tool tokens, is not an attention
    mask: an engine that needs it carries it apart); padding positions hold `pad_id` (None: 0)."""
    pad_id = 0 if pad_id is None else pad_id
    C = rows.completion_ids.shape[1]
    attention = (torch.arange(C, device=rows.completion_ids.device)[None, :]
                 < rows.completion_lengths()[:, None]).long()
    return {
        "prompt_ids": torch.where(rows.prompt_mask.bool(), rows.prompt_ids.long(), pad_id),
        "prompt_mask": rows.prompt_mask.long(),
        "completion_ids": torch.where(attention.bool(), rows.completion_ids.long(), pad_id),
        "completion_mask": attention,
    }
