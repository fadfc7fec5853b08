"""The transformers backend: HF `generate` with a KV cache, on the live model (CPU or GPU)."""
from __future__ import annotations

import os
from typing import Optional, Sequence

import torch

from ..errors import InputNotFound, UsageError

from . import Completion, Generation, SamplingParams


def encode_prompts(tokenizer, prompts: Sequence[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    tokenizer.padding_side = "left"
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True)
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(N, C) long: 1 for tokens up to and including the first EOS (all tokens if there is none).

    Computed from the first EOS rather than from pad ids because many tokenizers use one id for both."""
    is_eos = completion_ids == eos_id  # (N, C)
    pos = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    first = torch.where(is_eos.any(1), is_eos.long().argmax(1), torch.full_like(is_eos[:, 0], completion_ids.shape[1], dtype=torch.long))
    return (pos.unsqueeze(0) <= first.unsqueeze(1)).long()  # (N, C)


def decode(tokenizer, completion_ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    rows = [ids[m.bool()].tolist() for ids, m in zip(completion_ids.cpu(), mask.cpu())]
    return tokenizer.batch_decode(rows, skip_special_tokens=False)


@torch.no_grad()
def sample_groups(
    model,
    tokenizer,
    prompts: Sequence[str],
    group_size: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    greedy: bool = False,
) -> Generation:
    """Sample `group_size` completions for each prompt with HF generate (KV cache)."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts, device)  # (B, P)
    was_training = model.training
    model.eval()
    kw = dict(
        max_new_tokens=max_new_tokens,
        num_return_sequences=group_size,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        use_cache=True,
    )
    if greedy:
        kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kw)  # (B*G, P + C)
    model.train(was_training)
    P = prompt_ids.shape[1]
    comp = out[:, P:]  # (B*G, C)
    mask = completion_mask(comp, tokenizer.eos_token_id)  # (B*G, C)
    comp = comp * mask + tokenizer.pad_token_id * (1 - mask)
    return narrow(
        prompt_ids.repeat_interleave(group_size, 0), prompt_mask.repeat_interleave(group_size, 0), comp, mask,
        decode(tokenizer, comp, mask),
    )


def narrow(prompt_ids, prompt_mask, completion_ids, completion_mask, texts) -> Generation:
    """Generation on the host in the narrow form. Cast where the tensors are (on the model's device for HF
    generate, so the copy to the host moves half the bytes); token ids come from the tokenizer's
    vocabulary, far below 2**31."""
    return Generation(
        prompt_ids=prompt_ids.to(torch.int32).cpu(),
        prompt_mask=prompt_mask.ne(0).cpu(),
        completion_ids=completion_ids.to(torch.int32).cpu(),
        completion_mask=completion_mask.ne(0).cpu(),
        texts=texts,
    )


def generate_completions(
    model,
    tokenizer,
    prompts: Sequence[str],
    params: SamplingParams,
    seed: Optional[int] = None,
    add_special_tokens: bool = True,
) -> list[list[Completion]]:
    """Sample ``params.n`` completions per prompt with ``model.generate`` (one call, left padding).

    ``add_special_tokens`` should be False for chat-templated prompts, which already contain BOS.
    """
    if not prompts:
        return []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = _eos_ids(model, tokenizer)
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # generation appends on the right, so prompts must end flush
    try:
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)
    finally:
        tokenizer.padding_side = old_side
    device = next(model.parameters()).device
    enc = {k: v.to(device) for k, v in enc.items()}
    kwargs = dict(max_new_tokens=params.max_new_tokens, num_return_sequences=params.n, pad_token_id=pad_id)
    if params.temperature > 0:
        kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(params.seed if seed is None else seed)
        with torch.no_grad():
            out = model.generate(**enc, **kwargs)
    new = out[:, enc["input_ids"].shape[1] :].tolist()
    results: list[list[Completion]] = []
    for i in range(len(prompts)):
        group = []
        for row in new[i * params.n : (i + 1) * params.n]:
            length = _generated_length(row, eos_ids)
            text = tokenizer.decode(row[:length], skip_special_tokens=True)
            group.append(Completion(text=text, num_tokens=length))
        results.append(group)
    return results


def _eos_ids(model, tokenizer) -> set[int]:
    ids = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
    return ids


def _generated_length(row: Sequence[int], eos_ids: set[int]) -> int:
    """Tokens generated up to and including the first EOS (everything after it is padding)."""
    for j, tok in enumerate(row):
        if tok in eos_ids:
            return j + 1
    return len(row)


class TransformersGenerator:
    """The transformers backend; it reads the live policy, so there is nothing to sync after an update.

    ``add_special_tokens`` applies to `generate` (False for chat-templated prompts, which already hold BOS)."""

    def __init__(self, model, tokenizer, add_special_tokens: bool = True):
        self.model, self.tokenizer, self.add_special_tokens = model, tokenizer, add_special_tokens

    def sample(self, prompts: Sequence[str], group_size: int, max_new_tokens: int, temperature: float,
               seed: int | None = None) -> Generation:
        if seed is None:
            return sample_groups(self.model, self.tokenizer, prompts, group_size, max_new_tokens, temperature,
                                 greedy=temperature == 0)
        device = next(self.model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            return sample_groups(self.model, self.tokenizer, prompts, group_size, max_new_tokens, temperature,
                                 greedy=temperature == 0)

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[list[Completion]]:
        return generate_completions(self.model, self.tokenizer, prompts, params, seed, self.add_special_tokens)

    def sync(self) -> None:
        pass


def load_model(model: str, device: Optional[str] = None, dtype: str = "auto", model_file: Optional[str] = None):
    """Load a causal LM and its tokenizer from a local path, a hub id or a GGUF checkpoint (a .gguf path, or a
    directory plus ``model_file``; see :mod:`grpo_replay.app.models`), with clear errors."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ..app.models import as_plain_model, dense_source, resolve_model

    source = resolve_model(model, model_file, field="--model", file_field="--model-file")
    is_gguf = bool(source.gguf_file)
    source = dense_source(source)  # a GGUF file: its dequantized copy (made once, then cached)
    kw = source.kwargs()
    # A hub id is "name" or "org/name"; anything else that does not exist is a mistyped local path.
    looks_local = model.startswith((".", "/", "~")) or model.count("/") > 1
    path = source.path if is_gguf else os.path.expanduser(model)
    if looks_local and not os.path.exists(os.path.expanduser(model)):
        raise InputNotFound(f"--model {model}: path does not exist")
    try:
        config = AutoConfig.from_pretrained(path, **kw)
    except Exception as exc:
        raise UsageError(f"--model {model}: not a local model directory or loadable hub id ({exc})") from exc
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    else:
        torch_dtype = getattr(torch, dtype)
    try:
        lm = as_plain_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **source.model_kwargs()))
    except ValueError as exc:
        raise UsageError(
            f"--model {model}: not a causal LM (config type {type(config).__name__}); {exc}"
        ) from exc
    except Exception as exc:  # no weights file (OSError), a truncated one (safetensors' own error), ...
        raise UsageError(f"--model {model}: has a config but its weights cannot be loaded: {_first_line(exc)}") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kw)
    except Exception as exc:
        raise UsageError(f"--model {model}: has no loadable tokenizer: {_first_line(exc)}") from exc
    lm.to(device).eval()
    return lm, tokenizer


DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_device(device: str) -> None:
    """Refuse a --device this machine cannot use, before the model loads: auto | cpu | cuda | cuda:INDEX."""
    import torch

    if device in ("auto", "cpu"):
        return
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise UsageError(f"--device {device!r} is invalid; allowed: auto, cpu, cuda, cuda:INDEX")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {device!r}: no CUDA device is available here; allowed: auto, cpu")
    index = int(device[5:]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise UsageError(f"--device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                         f"allowed: cuda:0..cuda:{torch.cuda.device_count() - 1}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
