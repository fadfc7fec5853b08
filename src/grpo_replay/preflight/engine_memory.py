"""GPU memory per phase of a TRL or verl launch, beside the built-in trainer's (`trainer/memory.py`), from the
engines' own code (TRL 1.16, verl 0.9.1; docs/preflight.md states every term).

What is resident when decides whether vLLM's share adds to the update or competes with it:
  - TRL colocate with `vllm_enable_sleep_mode` puts the engine to sleep (level 2: weights and KV cache released)
    after each generation, and verl's colocated rollout (sync, colocate_async and the legacy trainer) does the same
    in `on_sample_end` when `rollout.free_cache_engine` is on (its default): the larger of vLLM's share and the
    trainer's phases counts;
  - TRL colocate without sleep mode, and verl with `free_cache_engine=false`, keep both: their sum counts;
  - TRL's server mode, the async TRL trainer and verl's separate_async generate on GPUs of their own: the trainer's
    GPUs carry no vLLM share.
"""
from __future__ import annotations

from ..trainer.memory import PROMPT_ROOM, Phases, Shape, generation_terms, trl_logits, update_terms


def trl_phases(shape: Shape, *, card: int, micro_rows: int, generation_rows: int, completion: int, precision: str,
               checkpointed: bool, vllm: str, utilization: float, sleep: bool, processes: int) -> Phases:
    """One TRL process on its GPU (DDP: a full replica). `micro_rows` per forward of the update (the composed rows
    / steps_per_generation), `generation_rows` generated at once by transformers when `vllm` is "" (no vLLM);
    `vllm` "colocate" (its share `utilization` x `card` on this GPU) or "server" (none here).

    TRL's log-probs go through its fused LM head (`add_fused_lm_head`, TRL 1.16): the logits exist one tile at a
    time (`memory.trl_logits`: TOKEN_TILE tokens x VOCAB_TILE vocabulary entries in the compute dtype), and its
    backward pass keeps a float32 gradient of the head's weight (vocab x hidden) beside the hidden states' gradient."""
    P = shape.params
    upd = update_terms(shape, micro_rows=micro_rows, tokens=PROMPT_ROOM + completion, precision=precision,
                       checkpointed=checkpointed, logit_tokens=0)
    upd["logits"] = trl_logits(shape, micro_rows * completion, precision)
    return Phases(
        weights=4 * P, adamw=8 * P, resident=4 * P if processes > 1 else 0,  # DDP's gradient buckets
        vllm=int(utilization * card) if vllm == "colocate" else 0, vllm_asleep=vllm == "colocate" and sleep,
        generation=0 if vllm else sum(generation_terms(shape, generation_rows, completion).values()),
        evaluation=0, scoring=trl_logits(shape, 0, precision), update=sum(upd.values()))


def verl_phases(shape: Shape, *, card: int, shards: int, tokens: int, logprob_tokens: int, checkpointed: bool,
                utilization: float, colocated: bool, asleep: bool) -> Phases:
    """One verl actor GPU: FSDP shards the float32 weights, gradients and AdamW's moments over `shards` GPUs and
    computes in bf16 (mixed precision: bf16 activations); a micro-batch of `tokens` tokens in the update,
    `logprob_tokens` in the no-grad log-prob pass. verl materialises the micro-batch's bf16 logits (flash-attn's
    cross-entropy computes its gradient in place); the log-prob pass also takes the entropy (a softmax and a
    product of the logits' shape). One FSDP unit's weights are gathered in bf16 at a time (the largest: the
    embedding)."""
    P, V = shape.params, shape.vocab
    layer = (P - V * shape.hidden) // max(shape.layers, 1)
    upd = update_terms(shape, micro_rows=1, tokens=tokens, precision="bf16-weights", checkpointed=checkpointed,
                       logit_tokens=tokens, logit_bytes=2)
    upd["gradients"] = 4 * P // shards
    upd["gathered bf16 weights"] = 2 * max(V * shape.hidden, layer)
    return Phases(weights=4 * P // shards, adamw=8 * P // shards, vllm=int(utilization * card) if colocated else 0,
                  vllm_asleep=colocated and asleep, generation=0, evaluation=0,
                  scoring=logprob_tokens * V * 2 * 3 + 2 * max(V * shape.hidden, layer), update=sum(upd.values()))


def describe(name: str, ph: Phases) -> list[str]:
    """The report's lines for one card: the sum, then the phases."""
    gib = 2**30
    vllm = f"vLLM's share {ph.vllm / gib:.1f}" if ph.vllm else "no vLLM share"
    if ph.vllm and ph.vllm_asleep:
        body = f"the larger of {vllm} (asleep during the update) and the largest phase ({ph.peak_phase()})"
    else:
        body = f"{vllm + ' + ' if ph.vllm else ''}the largest phase ({ph.peak_phase()})"
    resident = f" + DDP's gradient buckets {ph.resident / gib:.1f}" if ph.resident else ""
    return [f"{name}: weights {ph.weights / gib:.1f} + AdamW {ph.adamw / gib:.1f}{resident} + {body} = "
            f"{ph.total / gib:.1f} GiB",
            f"  phases: generation {ph.generation / gib:.1f}, scoring {ph.scoring / gib:.1f}, update "
            f"{ph.update / gib:.1f}, evaluation {ph.evaluation / gib:.1f} GiB" + ("" if ph.vllm else "; " + vllm)]


UNKNOWN_FIX = ("a local folder holding the model's config.json, or its config.json in the Hugging Face cache "
               "(`hf download ORG/NAME config.json` on a machine with the hub)")
