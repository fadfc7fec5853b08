"""One step's GPU memory by phase, estimated before the first step: settings that cannot fit are refused with the
estimate instead of growing until the kernel kills the process (group_size=100000 on the testbed reached 24 GB
before it was killed) or the GPU runs out at the step-0 evaluation or the first update, after vLLM has started.
`grpo-replay preflight` prints the same phases for a launch on a machine without the GPU (docs/preflight.md states
every term; `preflight/engine_memory.py` holds TRL's and verl's).

Resident for the whole run, beside the loaded float32 weights (P parameters): AdamW's two moments (8P bytes, from
the first update on) and, with generator=vllm, vLLM's share of the card (`VLLMGenerator.colocated`'s
gpu_memory_utilization x the device's total memory; its KV cache, the training rollouts' and the evaluation's, lives
inside it; the built-in trainer never puts the engine to sleep, so the share adds to every phase). Then the largest
of the phases, each at its peak:
  - generation (transformers backend only): the KV cache of every row generated at once, rows x layers x 2 x C x
    kv_width values of the model's dtype, kv_width = num_key_value_heads x head_dim (Qwen3: head_dim 128, wider
    than hidden / heads), and one decoding step's logits: rows x vocab float32 values four times over (the model's
    output, generate's float32 copy, the temperature-scaled scores, the sampling probabilities);
  - evaluation (through transformers: the built-in trainer's generator=transformers, and `--backend trl`): the same
    for the held-out problems generated at once x eval_samples; on a GPU the problems per call are as many as keep
    it within the largest other phase (`eval_chunk`);
  - scoring: a no-grad log-prob pass, one chunk of `logprobs.token_logps`' logits: the head's output in the compute
    dtype, then two float32 tensors of its shape (the scaled logits and the log-softmax's exponentials);
  - update: the gradients (4P), under bf16 autocast the weights' bf16 copies (2P), one logits chunk at the peak of
    its backward pass (the head's output in the compute dtype and three float32 tensors of its shape: the
    log-softmax's saved input, its exponentials and the gradient), and what every layer keeps per token of a
    micro-batch for the backward pass.
C is the completion budget; an update row counts C + PROMPT_ROOM tokens with the math reward (an allowance for the
prompt, which the estimate cannot see before the data is tokenized; the testbed's prompts are a few tokens). The activation bytes per token and layer are fitted to
what autograd saves in Qwen3 decoder layers of the 0.6B, 1.7B and 4B shapes (counted on CPU with saved-tensor
hooks, `tests/trainer/test_memory_bound.py` recounts them): 26 x hidden + 8 x intermediate + 10 x (q + kv width)
bytes under bf16 autocast over float32 weights (the norms and the residual stream stay float32), 16 / 8 / 10 with
bf16 weights (FSDP's mixed precision: only the norms' internals stay float32), 24 / 16 / 16 in float32; within 1 %
of the count at all three sizes. Other architectures keep a similar amount; the estimate is not a bound for them.
The update, the generation and AdamW's moments are measured on CPU for three small Qwen3-shaped models beside these
figures (`tests/trainer/test_memory_measured.py`, torch's profiler: within 25 %).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import ConfigError
from ..step_plan import plan_step
from .logprobs import chunk_tokens

# bytes per token and layer kept for the backward pass: (x hidden, x intermediate, x (q width + kv width));
# "bf16" is autocast over float32 weights, "bf16-weights" bf16 weights (FSDP's mixed precision)
ACTIVATION_BYTES = {"bf16": (26, 8, 10), "bf16-weights": (16, 8, 10), "fp32": (24, 16, 16)}
EVAL_CHUNK = 256  # held-out problems generated at once (evaluation.evaluate's chunk)
PROMPT_ROOM = 256  # prompt tokens of an update row with the math reward
SAMPLING_COPIES = 4  # float32 (rows, vocab) tensors of one decoding step (module docstring: generation)


@dataclass(frozen=True)
class Shape:
    """The model facts the estimate needs (a transformers config's names)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    params: int  # trainable parameters

    @classmethod
    def of(cls, config, params: int) -> "Shape":
        heads = getattr(config, "num_attention_heads", 1) or 1
        return cls(hidden=config.hidden_size, layers=config.num_hidden_layers, heads=heads,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                   head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                   intermediate=getattr(config, "intermediate_size", None) or config.hidden_size,
                   vocab=config.vocab_size, params=params)

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def activation_bytes(self, precision: str) -> int:
        """Bytes one token keeps per layer for the backward pass (module docstring)."""
        a, b, c = ACTIVATION_BYTES[precision]
        return a * self.hidden + b * self.intermediate + c * (self.heads * self.head_dim + self.kv_width)

    def kept_per_token(self, precision: str, checkpointed: bool = False) -> int:
        """Bytes one token keeps over all layers for the backward pass; with activation checkpointing each layer
        keeps only its input (float32, or bf16 with bf16 weights) and one layer's activations are recomputed at a
        time."""
        if checkpointed:
            kept_input = 2 if precision == "bf16-weights" else 4
            return self.layers * kept_input * self.hidden + self.activation_bytes(precision)
        return self.layers * self.activation_bytes(precision)

    def kv_bytes(self, rows: int, tokens: int, elem: int) -> int:
        return rows * self.layers * 2 * tokens * self.kv_width * elem


def compute_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def update_terms(shape: Shape, *, micro_rows: int, tokens: int, precision: str, checkpointed: bool = False,
                 logit_tokens: Optional[int] = None, logit_bytes: Optional[int] = None) -> dict[str, int]:
    """The update phase of the built-in trainer, term by term (module docstring): a micro-batch of `micro_rows`
    rows of `tokens` tokens (prompt + completion); `logit_tokens` the tokens whose logits are held at once
    (default one chunk of `logprobs.token_logps`), `logit_bytes` per token and vocabulary entry (default the
    compute dtype's output and three float32 tensors)."""
    P = shape.params
    n = min(micro_rows * tokens, chunk_tokens(shape.vocab)) if logit_tokens is None else logit_tokens
    per_entry = compute_bytes(precision) + 3 * 4 if logit_bytes is None else logit_bytes
    terms = {"gradients": 4 * P, "bf16 weight copies": 2 * P if precision == "bf16" else 0,
             "logits": n * shape.vocab * per_entry,
             "activations": micro_rows * tokens * shape.kept_per_token(precision, checkpointed)}
    # The embedding's backward, last of the pass (logits and activations freed by then), holds three dense float32
    # vocab x hidden tensors beside the gradients (its gradient, a temporary of that size, and the sum into the tied
    # weight's gradient; measured at the peak, inside EmbeddingBackward's add). Only its excess over the logits and
    # activations adds to the peak (none at the GPU recipes' shapes).
    terms["embedding gradient"] = max(0, 3 * 4 * shape.vocab * shape.hidden - terms["logits"] - terms["activations"])
    return terms


def generation_terms(shape: Shape, rows: int, tokens: int, kv_elem: int = 4) -> dict[str, int]:
    """Generating `rows` rows of `tokens` tokens with transformers at once: the KV cache and one decoding step's
    float32 logits and sampling copies (module docstring); nothing for no rows."""
    if not rows:
        return {"KV cache": 0, "logits": 0}
    return {"KV cache": shape.kv_bytes(rows, tokens, kv_elem), "logits": SAMPLING_COPIES * rows * shape.vocab * 4}


# TRL 1.16's fused LM head (`add_fused_lm_head`): tokens and vocabulary entries per tile of logits
# (kernels/chunked_logprob.TOKEN_CHUNK_SIZE, trainer/utils._CHUNKED_LOGPROB_CHUNK_SIZE)
TOKEN_TILE, VOCAB_TILE = 4096, 32768


def trl_logits(shape: Shape, tokens: int, precision: str) -> int:
    """TRL's log-probs of `tokens` tokens: one tile of logits in the compute dtype; with a backward pass (tokens >
    0) also the float32 gradients of the head's weight (vocab x hidden) and of the tokens' hidden states."""
    tile = min(max(tokens, 1), TOKEN_TILE) * min(shape.vocab, VOCAB_TILE) * compute_bytes(precision)
    return tile + (4 * shape.vocab * shape.hidden + 4 * tokens * shape.hidden if tokens else 0)


PHASES = ("generation", "evaluation", "scoring", "update")


@dataclass(frozen=True)
class Phases:
    """Bytes per phase on one GPU (module docstring). `need` is what the step needs beside the loaded weights,
    `total` with them. vLLM's share adds to every phase, unless the engine sleeps while the trainer computes
    (`vllm_asleep`: its weights and KV cache released), when the larger of the share and the phases counts."""

    adamw: int
    vllm: int
    generation: int
    evaluation: int
    scoring: int
    update: int
    weights: int = 0  # the loaded weights (float32: 4P; sharded under FSDP)
    resident: int = 0  # anything else held for the whole run (DDP's gradient buckets)
    vllm_asleep: bool = False

    def largest_phase(self) -> int:
        return max(getattr(self, k) for k in PHASES)

    @property
    def need(self) -> int:
        if self.vllm_asleep:
            return self.adamw + self.resident + max(self.vllm, self.largest_phase())
        return self.adamw + self.resident + self.vllm + self.largest_phase()

    @property
    def total(self) -> int:
        return self.weights + self.need

    def peak_phase(self) -> str:
        if self.vllm_asleep and self.vllm >= self.largest_phase():
            return "generation in vLLM"
        return max(PHASES, key=lambda k: getattr(self, k))

    def dominant(self, card: int = 0) -> str:
        """The term to cut first: vLLM's share when it takes over half the card, else the largest of the weights,
        AdamW's moments, vLLM's share and the peak phase ("weights", "adamw", "vllm" or a phase's name)."""
        if self.vllm and card and self.vllm > card / 2:
            return "vllm"
        phase = max(PHASES, key=lambda k: getattr(self, k))
        terms = {"weights": self.weights, "adamw": self.adamw, "vllm": self.vllm, phase: getattr(self, phase)}
        return max(terms, key=terms.get)


def phases(shape: Shape, *, rows: int, micro_rows: int, eval_rows: int, completion: int, precision: str,
           vllm_bytes: int, kv_elem: int = 4, prompt: int = 0, checkpointed: bool = False) -> Phases:
    """The phases of one step of the built-in trainer: `rows` generated at once (in vLLM's share when
    `vllm_bytes`), `micro_rows` per forward of the update, `eval_rows` held-out rows generated at once by
    transformers (0: none, or in vLLM). `checkpointed` (activation checkpointing, as TRL's
    gradient_checkpointing): each layer keeps only its input per token, and one layer's activations are
    recomputed at a time."""
    n = min(micro_rows * completion, chunk_tokens(shape.vocab))
    return Phases(
        adamw=8 * shape.params,
        vllm=vllm_bytes,
        weights=4 * shape.params,
        generation=0 if vllm_bytes else sum(generation_terms(shape, rows, completion, kv_elem).values()),
        evaluation=sum(generation_terms(shape, eval_rows, completion, kv_elem).values()),
        scoring=n * shape.vocab * (compute_bytes(precision) + 2 * 4),
        update=sum(update_terms(shape, micro_rows=micro_rows, tokens=prompt + completion, precision=precision,
                                checkpointed=checkpointed, logit_tokens=n).values()),
    )


def precision_of(cfg, device_type: str) -> str:
    """bf16 (autocast, float32 master weights) on a GPU unless TrainConfig.precision says fp32; fp32 on a CPU."""
    return "bf16" if device_type == "cuda" and cfg.precision in ("auto", "bf16") else "fp32"


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


def run_phases(cfg, shape: Shape, device_type: str, card_bytes: int = 0) -> Phases:
    """The phases of a TrainConfig's step on a device of that type (`card_bytes`: its total memory, for vLLM's
    share). The built-in trainer evaluates through its generator; `--backend trl` through transformers, `eval_chunk`
    problems at a time."""
    from ..generation.vllm import GPU_SHARE

    rows = cfg.prompts_per_step * cfg.group_size
    vllm = int(GPU_SHARE * card_bytes) if cfg.generator == "vllm" and device_type == "cuda" else 0
    completion = cfg.completion_budget()
    # The largest forward pass of the update: a micro-batch, or the fresh segment (replay adds a second pass);
    # TRL's forward holds the composed rows / steps_per_generation: micro_batch_size x (1 + replay_ratio).
    micro = min(cfg.micro_batch_size or rows, rows)
    if cfg.backend == "trl":
        unit = rows // micro
        micro = plan_step(rows, cfg.replay, unit, group_size=cfg.group_size).rows // unit
    ph_precision = precision_of(cfg, device_type)
    ph = phases(shape, rows=rows, micro_rows=micro, eval_rows=0,
                completion=completion, precision=ph_precision, vllm_bytes=vllm,
                prompt=PROMPT_ROOM if cfg.reward == "math" else 0)
    if cfg.backend == "trl":  # TRL's fused LM head instead of the built-in trainer's chunks
        prompt = PROMPT_ROOM if cfg.reward == "math" else 0
        terms = update_terms(shape, micro_rows=micro, tokens=prompt + completion, precision=ph_precision,
                             logit_tokens=0)
        terms["logits"] = trl_logits(shape, micro * completion, ph_precision)
        ph = dataclasses.replace(ph, update=sum(terms.values()), scoring=trl_logits(shape, 0, ph_precision))
    if eval_in_engine(cfg, device_type):
        return ph
    at_once = min(cfg.eval_problems, _eval_chunk(cfg, shape, device_type, ph)) * cfg.eval_samples
    return dataclasses.replace(ph, evaluation=sum(generation_terms(shape, at_once, completion).values()))


def eval_in_engine(cfg, device_type: str) -> bool:
    """Whether the held-out evaluation generates in vLLM (the built-in trainer's generator=vllm on a GPU)."""
    return cfg.backend == "builtin" and cfg.generator == "vllm" and device_type == "cuda"


def eval_chunk(cfg, shape: Shape, device_type: str, card_bytes: int = 0) -> int:
    """Held-out problems per transformers generate call: on a GPU as many as keep the evaluation (its KV cache and
    a decoding step's logits) within the largest other phase (at least one problem), so the evaluation never sets
    the run's peak; on a CPU the fixed `EVAL_CHUNK` (host memory is checked as a whole, and the chunking decides
    which random draws go to which row)."""
    return _eval_chunk(cfg, shape, device_type, run_phases(cfg, shape, device_type, card_bytes))


def _eval_chunk(cfg, shape: Shape, device_type: str, ph: Phases) -> int:
    if device_type != "cuda":
        return EVAL_CHUNK
    budget = max(ph.generation, ph.scoring, ph.update)
    per_problem = sum(generation_terms(shape, cfg.eval_samples, cfg.completion_budget()).values())
    return max(1, min(EVAL_CHUNK, budget // per_problem))


def model_shape(model) -> Shape:
    return Shape.of(model.config, sum(p.numel() for p in model.parameters() if p.requires_grad))


def card_bytes(device: torch.device) -> int:
    return torch.cuda.mem_get_info(device)[1] if device.type == "cuda" else 0


def check_step_memory(cfg, model, max_new: int, device: torch.device) -> None:
    """Refuse (ConfigError) settings whose step cannot fit in the memory this device has available now (the
    weights loaded; no optimizer state, no vLLM engine yet)."""
    ph = run_phases(cfg, model_shape(model), device.type, card_bytes(device))
    have = _available_bytes(device)
    if have is None or ph.need <= have:
        return
    raise ConfigError(refusal(cfg, ph, f"{device.type} has {have / 2**30:.1f} GiB available"))


# The TrainConfig key to change first, by the term that dominates (`Phases.dominant`).
FIELD_OF_TERM = {"update": "micro_batch_size", "generation": "group_size", "evaluation": "eval_problems",
                 "scoring": "model", "weights": "model", "adamw": "model", "vllm": "generator"}
TERM_WORDS = {"update": "the update", "generation": "generation's KV cache", "evaluation": "the evaluation's KV cache",
              "scoring": "the scoring pass's logits", "weights": "the weights", "adamw": "AdamW's moments",
              "vllm": "vLLM's share"}


def refusal(cfg, ph: Phases, have: str, card: int = 0) -> str:
    """The message naming the term that dominates, the fields and the fixes, for a step needing `ph` where `have`
    (words) is less."""
    gib = 2**30
    rows = cfg.prompts_per_step * cfg.group_size
    vllm = f"vLLM's share {ph.vllm / gib:.1f} GiB, " if ph.vllm else ""
    term = ph.dominant(card)
    return (
        f"TrainConfig.prompts_per_step={cfg.prompts_per_step} x group_size={cfg.group_size} = {rows} rows per step "
        f"needs at least {ph.need / gib:.1f} GiB beside the weights, most of it {TERM_WORDS[term]} "
        f"(TrainConfig.{FIELD_OF_TERM[term]}) ({vllm}AdamW's moments {ph.adamw / gib:.1f} GiB, "
        f"then the largest phase: generation's KV cache {ph.generation / gib:.1f} GiB, the evaluation's KV cache "
        f"{ph.evaluation / gib:.1f} GiB for eval_problems={cfg.eval_problems} x eval_samples={cfg.eval_samples}, "
        f"the update {ph.update / gib:.1f} GiB (gradients, logits and activations of "
        f"micro_batch_size={cfg.micro_batch_size or rows} rows x {cfg.completion_budget()} tokens)), but {have}; "
        f"allowed: fewer rows per step (prompts_per_step x group_size), a smaller completion budget (max_new_tokens), "
        f"a smaller micro_batch_size, fewer eval_problems or eval_samples, generator=vllm, or a smaller model or a "
        f"larger GPU (docs/paper_table.md: what fits where)"
    )
