"""Replay rows into TRL's batch dict, for `ReplayGRPOTrainer`: the kept fresh rows of TRL's dict followed by the
replay rows converted to TRL's keys, each key re-padded to shared widths (prompts on the left, completions on the
right, to TRL's `pad_to_multiple_of`)."""
from __future__ import annotations

from typing import Any

import torch

from ...adapter_rows import token_rows
from ...rollout import RolloutBatch, cat_padded

# Keys of TRL's batch dict this integration knows how to extend with replay rows.
PROMPT_KEYS = ("prompt_ids", "prompt_mask")
COMPLETION_KEYS = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "tool_mask",
    "importance_sampling_ratio",
)
ROW_KEYS = ("advantages",)


def is_row_value(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.dim() >= 1


def sequence_is(trainer) -> bool:
    """TRL's vLLM importance sampling is one ratio per sequence (its key holds one column)."""
    return trainer.vllm_importance_sampling_mode in ("sequence_mask", "sequence_truncate")


def merge_replay(trainer, out: dict[str, Any], kept: torch.Tensor, replay: RolloutBatch) -> dict[str, Any]:
    """Kept fresh rows of TRL's dict + the replay rows converted to TRL's keys, re-padded to shared widths."""
    device = trainer.accelerator.device
    pad_id = trainer._tokenizer.pad_token_id
    pad_id = 0 if pad_id is None else pad_id
    idx = kept.to(device)
    fresh = {k: (v[idx] if is_row_value(v) else v) for k, v in out.items()}
    if len(replay) == 0:
        return fresh
    rows = _replay_keys(trainer, out, replay.to(device))
    seq = sequence_is(trainer)
    merged = {}
    for key, value in fresh.items():
        if key not in rows:
            merged[key] = value
            continue
        other = rows[key].to(dtype=value.dtype)
        multiple = trainer.pad_to_multiple_of
        if key in PROMPT_KEYS:
            fill = pad_id if key == "prompt_ids" else 0
            merged[key] = cat_padded([value, other], left=True, value=fill, multiple=multiple)
        elif key in COMPLETION_KEYS and not (key == "importance_sampling_ratio" and seq):
            fill = {"completion_ids": pad_id, "tool_mask": 1, "importance_sampling_ratio": 1.0}.get(key, 0)
            merged[key] = cat_padded([value, other], left=False, value=fill, multiple=multiple)
        else:
            merged[key] = torch.cat([value, other])
    return merged


def _replay_keys(trainer, out: dict[str, Any], rep: RolloutBatch) -> dict[str, torch.Tensor]:
    """The replay rows under every key of TRL's dict `out` that has rows."""
    rows: dict[str, torch.Tensor] = {
        **token_rows(rep, trainer._tokenizer.pad_token_id),
        "advantages": rep.advantages,
        "old_per_token_logps": rep.behaviour_logps,
    }
    attention = rows["completion_mask"]
    if "tool_mask" in out:
        rows["tool_mask"] = torch.where(attention.bool(), rep.completion_mask, 1)
    if "ref_per_token_logps" in out:
        if rep.ref_logps is None:
            raise RuntimeError("ReplayGRPOTrainer: replayed rows carry no reference log-probs but beta != 0")
        rows["ref_per_token_logps"] = rep.ref_logps
    if "sampling_per_token_logps" in out:
        # The buffer keeps the trainer-side behaviour log-probs only; the vLLM-vs-trainer correction of a
        # replayed row is taken as 1 (its ratio to the behaviour policy is what PPO-clip handles).
        rows["sampling_per_token_logps"] = rep.behaviour_logps
    if "importance_sampling_ratio" in out:
        width = 1 if sequence_is(trainer) else rep.completion_ids.shape[1]
        rows["importance_sampling_ratio"] = torch.ones(len(rep), width, device=rep.completion_ids.device)
    return rows
