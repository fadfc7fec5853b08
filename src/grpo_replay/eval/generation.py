"""Prompt construction and sampling backends (transformers ``generate``; vLLM when installed).

A backend is a :class:`Generator`: given prompt strings and a seed it returns, per prompt, ``n``
:class:`Completion` objects (text and generated-token count, EOS included, padding excluded).
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Optional, Protocol, Sequence

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""Default instruction appended to every problem (the same text the math training task uses)."""
BACKENDS = ("transformers", "vllm")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by both backends (temperature 0 means greedy decoding)."""

    n: int = 16
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n (samples per problem) must be >= 1, got {self.n}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):  # nan < 0 is False: test what is allowed
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.temperature == 0 and self.n > 1:
            # Greedy decoding has one answer per prompt: n copies of it would inflate pass@k's sample count and
            # transformers refuses num_return_sequences > 1 without sampling.
            raise ValueError(f"n={self.n} with temperature=0 (greedy decoding, one completion per problem); allowed: "
                             f"n=1 with temperature 0, or a temperature > 0 to sample n completions")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Completion:
    text: str
    num_tokens: int


def build_prompt(problem: str, tokenizer=None, instruction: str = INSTRUCTION, use_chat_template: bool = True) -> str:
    """The model input for one problem.

    ``instruction`` is appended on a new line; if it contains ``{problem}`` it is used as the whole user
    message template instead. With ``use_chat_template`` and a tokenizer that has a chat template, the user
    message is wrapped in it (with the generation prompt); otherwise the plain text is returned.
    """
    message = instruction.replace("{problem}", problem) if "{problem}" in instruction else f"{problem}\n{instruction}"
    if use_chat_template and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
    return message


class Generator(Protocol):
    """A sampling backend: ``n`` completions for each prompt."""

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[list[Completion]]:
        ...


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
    import torch

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
    """transformers ``generate`` backend (CPU or GPU)."""

    def __init__(self, model, tokenizer, add_special_tokens: bool = True):
        self.model, self.tokenizer, self.add_special_tokens = model, tokenizer, add_special_tokens

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[list[Completion]]:
        return generate_completions(self.model, self.tokenizer, prompts, params, seed, self.add_special_tokens)


class VLLMGenerator:
    """vLLM backend (optional extra ``grpo-replay[vllm]``, GPU only)."""

    def __init__(self, model_path: str, tokenizer, add_special_tokens: bool = True, **llm_kwargs):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(
                "--backend vllm needs vLLM: pip install vllm, or pip install -e '.[vllm]' in a grpo-replay checkout (GPU only); or use --backend transformers"
            ) from exc
        self.llm = LLM(model=model_path, **llm_kwargs)
        self.tokenizer, self.add_special_tokens = tokenizer, add_special_tokens

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[list[Completion]]:
        from vllm import SamplingParams as VSamplingParams

        sp = VSamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p if params.temperature > 0 else 1.0,
            max_tokens=params.max_new_tokens,
            seed=seed,
        )
        # Token-id prompts so BOS handling matches the transformers backend exactly.
        inputs = [
            {"prompt_token_ids": self.tokenizer(p, add_special_tokens=self.add_special_tokens)["input_ids"]}
            for p in prompts
        ]
        outputs = self.llm.generate(inputs, sp, use_tqdm=False)
        return [[Completion(text=o.text, num_tokens=len(o.token_ids)) for o in out.outputs] for out in outputs]


def load_model(model: str, device: Optional[str] = None, dtype: str = "auto", model_file: Optional[str] = None):
    """Load a causal LM and its tokenizer from a local path, a hub id or a GGUF checkpoint (a .gguf path, or a
    directory plus ``model_file``; see :mod:`grpo_replay.models`), with clear errors."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ..models import as_plain_model, dense_source, resolve_model

    source = resolve_model(model, model_file, field="--model", file_field="--model-file")
    is_gguf = bool(source.gguf_file)
    source = dense_source(source)  # a GGUF file: its dequantized copy (made once, then cached)
    kw = source.kwargs()
    # A hub id is "name" or "org/name"; anything else that does not exist is a mistyped local path.
    looks_local = model.startswith((".", "/", "~")) or model.count("/") > 1
    path = source.path if is_gguf else os.path.expanduser(model)
    if looks_local and not os.path.exists(os.path.expanduser(model)):
        raise FileNotFoundError(f"--model {model}: path does not exist")
    try:
        config = AutoConfig.from_pretrained(path, **kw)
    except Exception as exc:
        raise ValueError(f"--model {model}: not a local model directory or loadable hub id ({exc})") from exc
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    else:
        torch_dtype = getattr(torch, dtype)
    try:
        lm = as_plain_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **source.model_kwargs()))
    except ValueError as exc:
        raise ValueError(
            f"--model {model}: not a causal LM (config type {type(config).__name__}); {exc}"
        ) from exc
    except Exception as exc:  # no weights file (OSError), a truncated one (safetensors' own error), ...
        raise ValueError(f"--model {model}: has a config but its weights cannot be loaded: {_first_line(exc)}") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kw)
    except Exception as exc:
        raise ValueError(f"--model {model}: has no loadable tokenizer: {_first_line(exc)}") from exc
    lm.to(device).eval()
    return lm, tokenizer


DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_device(device: str) -> None:
    """Refuse a --device this machine cannot use, before the model loads: auto | cpu | cuda | cuda:INDEX."""
    import torch

    if device in ("auto", "cpu"):
        return
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"--device {device!r} is invalid; allowed: auto, cpu, cuda, cuda:INDEX")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {device!r}: no CUDA device is available here; allowed here: auto, cpu")
    index = int(device[5:]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise ValueError(f"--device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                         f"allowed: cuda:0..cuda:{torch.cuda.device_count() - 1}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
