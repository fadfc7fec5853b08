"""TRL async samples <-> the core's `RolloutBatch`, for `ReplayAsyncGRPOTrainer`.

A sample is the dict TRL's `RolloutQueueDataset` yields (what its planner and collator read): `input_ids` (L,) int64,
`completion_mask` (L,) int64 (1 = a token the loss is taken over), `old_log_probs` (L,) float32 (the sampler's
log-probs, read where the mask is 1), `advantage` float, `group_id` int, `metrics` dict (per-sample rewards, logged by
the collator). This integration adds `model_version` (the version stamp the sample left the queue with) and its own
bookkeeping keys (`SERIAL`, `IS_REPLAY`, `AGE`, and a replayed row's `BUFFER_SEQ`), which TRL's planner and collator do not read.

As a buffer row, the prompt is everything before the first loss token and the completion runs from there through the
last loss token; context tokens between loss tokens (tool results, a demoted turn) stay, with mask 0. Tokens after the
last loss token are not stored: attention is causal, so they change no loss term. A replayed sample is rebuilt from
the stored row exactly: the same tokens, mask and float32 log-probs, the advantage as the float32 the loss receives.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import torch

from ...rollout import RolloutBatch

SERIAL = "replay_serial"  # int: emission number, unique over the run (checkpoints included)
IS_REPLAY = "replay_is_replay"  # bool
AGE = "replay_age"  # int: model versions since the row was generated, measured when it was drawn (0 for fresh)
BUFFER_SEQ = "replay_buffer_seq"  # int: a replayed row's insertion number in the buffer (absent for fresh samples)


def zero_variance(sample: dict[str, Any]) -> bool:
    """Whether the sample's group has no reward variance: `metrics["reward_std"]` (TRL's worker stamps its group's
    std on every sample) is 0 or NaN; a worker that stamps none: its advantage is exactly 0."""
    std = sample["metrics"].get("reward_std")
    if std is None:
        return float(sample["advantage"]) == 0.0
    return not std > 0  # NaN: no scorable reward in the group


def loss_span(sample: dict[str, Any]) -> tuple[int, int]:
    """(first, end): the first loss position and one past the last; (L, L) when the sample has none."""
    idx = np.flatnonzero(np.asarray(sample["completion_mask"]))
    n = len(sample["input_ids"])
    return (int(idx[0]), int(idx[-1]) + 1) if len(idx) else (n, n)


def check_behaviour_logps(sample: dict[str, Any]) -> None:
    """Raise ValueError when a sample carries no usable behaviour log-probs: replay needs the sampler's own."""
    lp = sample.get("old_log_probs")
    if lp is None or len(lp) != len(sample["input_ids"]):
        raise ValueError(
            "ReplayAsyncGRPOTrainer: a rollout sample has no old_log_probs of its input_ids' length; replay stores the "
            "sampler's log-probs as the behaviour policy of every replayed row. Use a rollout worker that returns them "
            "(TRL's AsyncRolloutWorker does), or replay_ratio=0."
        )
    first, end = loss_span(sample)
    mask = np.asarray(sample["completion_mask"])[first:end] != 0
    if end > first and not np.any(np.asarray(lp)[first:end][mask]):
        raise ValueError(
            "ReplayAsyncGRPOTrainer: a rollout sample's old_log_probs are 0 at every loss token, i.e. the worker "
            "returned none (a sampled token has probability 1 only with a degenerate policy); replay needs the "
            "sampler's log-probs. Use a rollout worker that returns them, or replay_ratio=0."
        )


def to_batch(samples: Sequence[dict[str, Any]], step: Optional[int] = None) -> RolloutBatch:
    """Fresh samples as a RolloutBatch (B = len(samples)): prompts left-padded, completions right-padded, each born
    at `step`, or at its own `model_version` when None. Each must have a loss token."""
    spans = [loss_span(s) for s in samples]
    P = max((a for a, _ in spans), default=0)
    C = max((b - a for a, b in spans), default=0)
    n = len(samples)
    prompt_ids, prompt_mask = torch.zeros(n, P, dtype=torch.long), torch.zeros(n, P, dtype=torch.bool)
    comp_ids, comp_mask = torch.zeros(n, C, dtype=torch.long), torch.zeros(n, C, dtype=torch.bool)
    logps = torch.zeros(n, C, dtype=torch.float32)
    for i, (s, (a, b)) in enumerate(zip(samples, spans)):
        ids = torch.as_tensor(np.asarray(s["input_ids"]), dtype=torch.long)
        prompt_ids[i, P - a :], prompt_mask[i, P - a :] = ids[:a], True
        comp_ids[i, : b - a] = ids[a:b]
        comp_mask[i, : b - a] = torch.as_tensor(np.asarray(s["completion_mask"])[a:b] != 0)
        logps[i, : b - a] = torch.as_tensor(np.asarray(s["old_log_probs"], dtype=np.float32)[a:b])
    std = [s["metrics"].get("reward_std", 0.0) for s in samples]
    reward = [s["metrics"].get("reward", 0.0) for s in samples]
    batch = RolloutBatch.fresh(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=comp_ids, completion_mask=comp_mask,
        behaviour_logps=logps,
        advantages=torch.tensor([float(s["advantage"]) for s in samples], dtype=torch.float32),
        rewards=torch.tensor([_finite(r) for r in reward], dtype=torch.float32),
        group_ids=torch.tensor([int(s["group_id"]) for s in samples], dtype=torch.long),
        group_std=torch.tensor([_finite(x) for x in std], dtype=torch.float32),
        step=0 if step is None else step,
    )
    if step is None:
        batch.birth_step = torch.tensor([int(s["model_version"]) for s in samples], dtype=torch.long)
    return batch


def from_batch(batch: RolloutBatch, group_ids: Sequence[int], ages: Sequence[int]) -> list[dict[str, Any]]:
    """Replay rows (from `ReplayBuffer.sample`) as samples for TRL's planner; `group_ids` are the rows' original TRL
    group ids (so TRL's count of prompt groups trained is not inflated), `ages` their ages in model versions."""
    out = []
    for i in range(len(batch)):
        pm = batch.prompt_mask[i].bool()
        prompt = batch.prompt_ids[i][pm].long()
        L = int(batch.completion_lengths()[i])
        comp = batch.completion_ids[i, :L].long()
        zeros = np.zeros(len(prompt), dtype=np.int64)
        out.append({
            "input_ids": torch.cat([prompt, comp]).numpy(),
            "completion_mask": np.concatenate([zeros, batch.completion_mask[i, :L].numpy().astype(np.int64)]),
            "old_log_probs": np.concatenate([zeros.astype(np.float32), batch.behaviour_logps[i, :L].numpy()]),
            "advantage": float(batch.advantages[i]),
            "group_id": int(group_ids[i]),
            "metrics": {},  # the collator's reward metrics stay those of the fresh samples
            "model_version": int(batch.birth_step[i]),
            IS_REPLAY: True,
            AGE: int(ages[i]),
            BUFFER_SEQ: int(batch.buffer_seq[i]),
        })
    return out


def _finite(x: Any) -> float:
    x = float(x)
    return x if math.isfinite(x) else 0.0


_ARRAYS = ("input_ids", "completion_mask", "old_log_probs")


def sample_state(s: dict[str, Any]) -> dict[str, Any]:
    """A sample as what `torch.load(weights_only=True)` reads back (tensors, numbers, strings)."""
    out = {k: (torch.from_numpy(np.asarray(v)) if k in _ARRAYS else v) for k, v in s.items() if k != "metrics"}
    out["metrics"] = {k: float(v) for k, v in s["metrics"].items()}
    return out


def sample_from_state(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.numpy() if k in _ARRAYS else v) for k, v in d.items()}
