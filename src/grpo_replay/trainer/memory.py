"""A lower bound on one step's memory, checked before the first step: settings that cannot fit are refused with
the estimate instead of growing until the kernel kills the process (group_size=100000 on the testbed reached
24 GB before it was killed) or the GPU runs out at the first update, after vLLM has started and generated.

The bound counts only the largest tensors a step must hold at once beside the loaded weights, with the completion
budget as the only sequence length (prompts make it larger still):
  - generation: the KV cache of every generated row, rows x layers x 2 x C x kv_width values of the model's dtype
    (with generator=vllm the cache lives in vLLM's share instead);
  - the update: the logits of one forward pass (a micro-batch, or without micro_batch_size one segment of the
    composed batch: the fresh rows, then the replay rows), rows x C x vocabulary values in the model's dtype and
    again as float32, at most one chunk of `logprobs.token_logps` (which scores large batches a chunk of tokens at
    a time), plus what every layer keeps per token for the backward pass: at least its two norms' inputs and
    outputs (4 x hidden) and, in a gated (SiLU) MLP, the gate, up and activated values (3 x intermediate), or in a
    plain MLP the activation's input (2 x hidden + intermediate). Measured on Qwen3's shapes (the saved tensors of
    a float32 decoder layer) it is 24-30 x hidden, about twice this bound;
  - the optimizer: AdamW's two moments, 2 x the parameters' bytes, allocated at the first update;
  - always: the gradients (the parameters' bytes) and, with generator=vllm, vLLM's share of the GPU
    (`VLLMGenerator.colocated`'s gpu_memory_utilization x the device's total memory).
The step needs vLLM's share + the gradients + the largest of generation, update and optimizer. It is a bound from
below, so a refused setting cannot fit; an accepted one may still be too large.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from ..errors import ConfigError
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
    inter = getattr(model_config, "intermediate_size", None) or hidden
    gated = getattr(model_config, "hidden_act", None) in ("silu", "swish")
    per_layer = 4 * hidden + 3 * inter if gated else 2 * hidden + inter  # kept per token for the backward pass
    return {
        "generation": rows * layers * 2 * completion * kv_width * elem,
        "update": (min(update_rows * completion, chunk_tokens(vocab)) * vocab * (elem + 4)
                   + update_rows * completion * layers * per_layer * elem),
    }


def step_need(parts: dict[str, int], param_bytes: int, vllm_bytes: int = 0) -> int:
    """Bytes beyond the loaded weights: vLLM's share + gradients + the largest of generation, update and AdamW's
    moments (2 x param_bytes); with vLLM the KV cache is inside its share."""
    phases = [parts["update"], 2 * param_bytes] + ([] if vllm_bytes else [parts["generation"]])
    return vllm_bytes + param_bytes + max(phases)


def check_step_memory(cfg, model, max_new: int, device: torch.device) -> None:
    """Refuse (ConfigError) settings whose step cannot fit in the memory this device has available now (the
    weights loaded; no optimizer state, no vLLM engine yet)."""
    rows = cfg.prompts_per_step * cfg.group_size
    eval_rows = min(cfg.eval_problems, 256) * cfg.eval_samples  # evaluation generates 256 problems at a time
    # The largest forward pass of the update: a micro-batch, or the fresh segment (replay adds a second pass).
    mb = min(cfg.micro_batch_size or rows, rows)
    elem = next(model.parameters()).element_size()
    parts = step_bytes(model.config, max(rows, eval_rows), mb, max_new, elem)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    vllm_bytes = 0
    if cfg.generator == "vllm" and device.type == "cuda":
        from ..generation.vllm import GPU_SHARE

        vllm_bytes = int(GPU_SHARE * torch.cuda.mem_get_info(device)[1])
    need = step_need(parts, param_bytes, vllm_bytes)
    have = _available_bytes(device)
    if have is None or need <= have:
        return
    gib = 2**30
    vllm = f"vLLM's share {vllm_bytes / gib:.1f} GiB, " if vllm_bytes else ""
    raise ConfigError(
        f"TrainConfig.prompts_per_step={cfg.prompts_per_step} x group_size={cfg.group_size} = {rows} rows per step "
        f"needs at least {need / gib:.1f} GiB beside the weights ({vllm}gradients {param_bytes / gib:.1f} GiB, then "
        f"the largest of: generation's KV cache {parts['generation'] / gib:.1f} GiB, the update's logits and "
        f"activations {parts['update'] / gib:.1f} GiB for {mb} rows x {max_new} tokens, AdamW's moments "
        f"{2 * param_bytes / gib:.1f} GiB), but {device.type} has {have / gib:.1f} GiB available; allowed: fewer rows "
        f"per step (prompts_per_step x group_size), a smaller completion budget (max_new_tokens), micro_batch_size "
        f"for the update, or a smaller model or a larger GPU (docs/paper_table.md: what fits where)"
    )
