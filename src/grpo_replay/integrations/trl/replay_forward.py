"""The forward passes `ReplayGRPOTrainer` makes outside TRL's loss, and the drift bound that reads one.

- `collective_logps`: the current policy's log-probs of some rows (fresh rows that pool composition displaced, or
  the replayed rows), a no-grad pass run on every process alike (under FSDP or ZeRO-3 a forward is a collective).
- `drift_check` (`replay.max_drift`): each replayed row's drift from the policy about to update, the built-in
  trainer's measure (`loss.replay_drift`); the rows above the bound are evicted by the session and left out of the
  batch before TRL fixes its normaliser, so TRL's loss, whatever its `loss_type`, is over the rows kept.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch
from trl.models.utils import disable_gradient_checkpointing

from ...adapter_rows import TOKEN_KEYS, token_rows
from ...loss import replay_drift
from ...rollout import RolloutBatch

FORWARD_KEYS = TOKEN_KEYS  # what a forward over rows reads (TRL names them as the core does)


class DriftCheck(NamedTuple):
    """One generation's drift bound: the replay rows drawn, their drift, which were dropped."""

    replay: RolloutBatch
    drift: torch.Tensor  # (R,) float
    dropped: torch.Tensor  # (R,) bool


def collective_logps(trainer, rows: dict[str, torch.Tensor]) -> Optional[torch.Tensor]:
    """(n, C) current log-probs of this process's `rows` (FORWARD_KEYS), None when no process has any. Every process
    runs the same passes: each pads its rows (none included) to the largest count with copies of its row 0 (or a
    one-token stand-in), whose log-probs are discarded."""
    device = trainer.accelerator.device
    n = int(rows["completion_ids"].shape[0])
    most = int(trainer.accelerator.gather(torch.tensor([n], device=device)).max())
    if most == 0:
        return None
    if n == 0:  # nothing of its own: one token stands in, so the collective passes still match
        rows = {k: torch.ones(1, 1, dtype=torch.long, device=device) for k in FORWARD_KEYS}
    idx = torch.cat([torch.arange(n), torch.zeros(most - n, dtype=torch.long)]).to(device)
    return current_logps(trainer, {k: rows[k].to(device)[idx] for k in FORWARD_KEYS})[:n]


def current_logps(trainer, out: dict[str, Any]) -> torch.Tensor:
    """(B, C) the current policy's log-probs of TRL's token keys `out` (FORWARD_KEYS), without gradient."""
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attention, out["completion_ids"].size(1),
            batch_size=trainer.args.per_device_train_batch_size,
        )
    return logps


def drift_check(trainer, replay: RolloutBatch) -> Optional[DriftCheck]:
    """Under replay.max_drift: measure, evict and report the drifted rows of this generation's `replay` rows (every
    process must call it: the forward is collective); None without the option."""
    session = trainer.replay_session
    if session.config.max_drift is None:
        return None
    logps = collective_logps(trainer, token_rows(replay, trainer._tokenizer.pad_token_id))
    if logps is None or len(replay) == 0:
        return DriftCheck(replay, torch.zeros(0), torch.zeros(0, dtype=torch.bool))
    drift = replay_drift(logps.float().cpu(), replay)
    dropped = session.drifted(replay, drift)
    session.evict_drifted(replay.buffer_seq[dropped])
    return DriftCheck(replay, drift, dropped)
