"""A lower bound on one step's memory, checked before the first step: settings that cannot fit are refused with
the estimate instead of growing until the kernel kills the process (group_size=100000 on the testbed reached
24 GB before it was killed).

The bound counts only the largest tensors a step must hold at once, with the completion budget as the only
sequence length (prompts make it larger still):
  - generation: the KV cache of every generated row, rows x layers x 2 x C x kv_width values of the model's dtype;
  - the update: the logits of one forward pass (a micro-batch, or without micro_batch_size one segment of the
    composed batch: the fresh rows, then the replay rows), rows x C x vocabulary values in the model's dtype and
    again as float32, at most one chunk of `logprobs.token_logps` (which scores large batches a chunk of tokens at
    a time), plus one activation per layer and token kept for the backward pass.
It is a bound from below, so a refused setting cannot fit; an accepted one may still be too large.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from ..app import configio
from .logprobs import chunk_tokens


def _available_bytes(device: torch.device) -> Optional[int]:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None  # unknown: nothing is refused


def step_bytes(model_config, rows: int, update_rows: int, completion: int, elem: int = 4) -> dict[str, int]:
    """{"generation": ..., "update": ...} lower bounds in bytes (see the module docstring)."""
    hidden = model_config.hidden_size
    layers = model_config.num_hidden_layers
    heads = getattr(model_config, "num_attention_heads", 1) or 1
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    kv_width = hidden * kv_heads // heads
    vocab = model_config.vocab_size
    return {
        "generation": rows * layers * 2 * completion * kv_width * elem,
        "update": (min(update_rows * completion, chunk_tokens(vocab)) * vocab * (elem + 4)
                   + update_rows * completion * layers * hidden * elem),
    }


def check_step_memory(cfg, model, max_new: int, device: torch.device) -> None:
    """Refuse (ConfigError) settings whose step cannot fit in the memory this device has available now."""
    rows = cfg.prompts_per_step * cfg.group_size
    eval_rows = min(cfg.eval_problems, 256) * cfg.eval_samples  # evaluation generates 256 problems at a time
    # The largest forward pass of the update: a micro-batch, or the fresh segment (replay adds a second pass).
    mb = min(cfg.micro_batch_size or rows, rows)
    elem = next(model.parameters()).element_size()
    parts = step_bytes(model.config, max(rows, eval_rows), mb, max_new, elem)
    need = max(parts.values())
    have = _available_bytes(device)
    if have is None or need <= have:
        return
    gib = 2**30
    raise configio.ConfigError(
        f"TrainConfig.prompts_per_step={cfg.prompts_per_step} x group_size={cfg.group_size} = {rows} rows per step "
        f"needs at least {need / gib:.1f} GiB (generation's KV cache {parts['generation'] / gib:.1f} GiB, the update's "
        f"logits and activations {parts['update'] / gib:.1f} GiB for {mb} rows x {max_new} tokens), but {device.type} "
        f"has {have / gib:.1f} GiB available; allowed: fewer rows per step (prompts_per_step x group_size), a smaller "
        f"completion budget (max_new_tokens), or micro_batch_size for the update"
    )
