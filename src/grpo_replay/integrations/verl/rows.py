"""What both trainers read off a fresh verl row: its prompt's stable identity and its one advantage."""
from __future__ import annotations

import hashlib

import numpy as np
import torch


def prompt_key(token_ids) -> int:
    """Stable 63-bit identity of a prompt: blake2b of its unpadded token ids as int64 (a numpy array or a
    tensor, any integer dtype; the same across steps, runs and trainers)."""
    if isinstance(token_ids, torch.Tensor):
        token_ids = token_ids.cpu().numpy()
    h = hashlib.blake2b(np.ascontiguousarray(token_ids, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFF_FFFF_FFFF_FFFF


def row_advantages(advantages: torch.Tensor, response_mask: torch.Tensor, atol: float = 1e-4) -> torch.Tensor:
    """(B,) per-row advantage A_i from verl's token-level (B,R) advantages.

    Outcome estimators (GRPO, RLOO, REINFORCE++-baseline, ...) broadcast one value over the response; a row whose
    advantages vary over its response tokens (GAE) cannot be stored as a rollout with one A_i: ValueError.
    """
    m = response_mask.float()
    if m.shape[1] == 0:
        return torch.zeros(m.shape[0], dtype=torch.float32)
    first = m.argmax(-1)  # the value at the first counted token, exactly (a masked mean would round)
    a = advantages.float().gather(1, first[:, None]).squeeze(1) * (m.sum(-1) > 0)
    dev = ((advantages.float() - a[:, None]).abs() * m).amax(-1) if m.shape[1] else torch.zeros_like(a)
    if bool((dev > atol * (1 + a.abs())).any()):
        bad = torch.nonzero(dev > atol * (1 + a.abs())).flatten()[:5].tolist()
        raise ValueError(
            "verl advantages vary over the response tokens of rows "
            f"{bad}: replay stores one advantage per rollout and supports outcome estimators (grpo, rloo, ...) only"
        )
    return a
