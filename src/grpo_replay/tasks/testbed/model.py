"""Tiny causal LM from a transformers config, batched sampling and the sampled pass rate."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel, Qwen2Config

from .testbed_config import TestbedConfig


def model_config(cfg: TestbedConfig, tokenizer):
    """The transformers config (LlamaConfig or Qwen2Config) of the testbed model."""
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.02,
        use_cache=True,
    )
    if cfg.model_type == "llama":
        return LlamaConfig(**common)
    return Qwen2Config(**common)


def build_model(cfg: TestbedConfig, tokenizer) -> PreTrainedModel:
    """Randomly initialised float32 causal LM (``AutoModelForCausalLM.from_config``).

    Initialisation depends on the global torch RNG: seed it first for reproducibility.
    """
    mcfg = model_config(cfg, tokenizer)
    model = AutoModelForCausalLM.from_config(mcfg, dtype=torch.float32, attn_implementation="sdpa")
    gc = model.generation_config
    gc.pad_token_id = tokenizer.pad_token_id
    gc.eos_token_id = tokenizer.eos_token_id
    gc.bos_token_id = tokenizer.bos_token_id
    return model


def n_params(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def generate_completions(
    model: PreTrainedModel,
    tokenizer,
    prompts: Sequence[str],
    num_return_sequences: int = 1,
    max_new_tokens: int = 24,
    temperature: float = 1.0,
    do_sample: bool = True,
    seed: int | None = None,
) -> tuple[list[str], torch.Tensor]:
    """Sample completions with HF ``generate`` (KV cache, left-padded prompts).

    Returns ``(texts, completion_ids)``: texts are decoded with special tokens kept and cut
    after the first ``<eos>`` (so truncation is visible); ``completion_ids`` is the raw
    ``[len(prompts) * num_return_sequences, T]`` tensor of generated ids (pad after EOS),
    grouped by prompt (rows ``i*k .. i*k+k-1`` belong to prompt ``i``).
    """
    from ...generation.transformers import sample_groups  # the trainer's sampler: one implementation of sampling

    if seed is not None:
        torch.manual_seed(seed)
    g = sample_groups(model, tokenizer, prompts, num_return_sequences, max_new_tokens, temperature, greedy=not do_sample)
    return g.texts, g.completion_ids


def decode_completions(tokenizer, completion_ids: torch.Tensor) -> list[str]:
    """Decode generated ids, keeping ``<eos>`` and dropping everything after it."""
    eos = tokenizer.eos_token_id
    texts = []
    for row in completion_ids.tolist():
        if eos in row:
            row = row[: row.index(eos) + 1]
        row = [t for t in row if t != tokenizer.pad_token_id]
        texts.append(tokenizer.decode(row, skip_special_tokens=False))
    return texts


def sampled_pass_rate(
    model: PreTrainedModel,
    task,
    problems: Sequence,
    n_samples: int = 1,
    max_new_tokens: int | None = None,
    seed: int = 0,
    temperature: float = 1.0,
    batch_size: int = 512,
    return_details: bool = False,
):
    """Mean reward of ``n_samples`` sampled completions per problem (temperature 1, no top-k/p).

    With ``return_details=True`` returns ``(rate, details)`` where details holds per-sample
    ``rewards`` (``[len(problems), n_samples]`` list of lists), ``texts`` and ``difficulty``.
    """
    if max_new_tokens is None:
        max_new_tokens = task.cfg.max_new_tokens
    rewards: list[list[float]] = []
    texts: list[list[str]] = []
    gen = torch.random.fork_rng(devices=[])
    with gen:
        torch.manual_seed(seed)
        for start in range(0, len(problems), max(1, batch_size // n_samples)):
            chunk = problems[start: start + max(1, batch_size // n_samples)]
            t, _ = generate_completions(
                model, task.tokenizer, [p.prompt for p in chunk], num_return_sequences=n_samples,
                max_new_tokens=max_new_tokens, temperature=temperature,
            )
            for i, p in enumerate(chunk):
                ts = t[i * n_samples: (i + 1) * n_samples]
                texts.append(ts)
                rewards.append([task.reward(x, p) for x in ts])
    flat = [r for rs in rewards for r in rs]
    rate = float(sum(flat) / max(1, len(flat)))
    if return_details:
        return rate, {"rewards": rewards, "texts": texts, "difficulty": [p.difficulty for p in problems]}
    return rate


__all__ = ["build_model", "model_config", "n_params", "generate_completions", "decode_completions", "sampled_pass_rate"]
