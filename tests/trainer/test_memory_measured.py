"""trainer/memory.py's figures beside what the built-in trainer really allocates on CPU, for three small Qwen3-shaped
models (random weights from a `Qwen3Config`), each sized so that a different term dominates: the logits, the
activations, the gradients.

Measured with torch's own profiler (`profile_memory=True`): every allocation and free of torch's CPU allocator, in
order, summed into the live bytes; the peak above the live bytes at the start is the phase's figure. (The process's
peak RSS would also count the interpreter, imports and the C library's cached heap, and a page is resident only
once written, so a delta of it says less about what the estimate counts: tensor bytes.) Measured per phase:
  - AdamW's two moments: what the first `update.update` leaves allocated (its gradients are freed);
  - the update: the peak of the second `update.update` (moments already there), over its micro-batches;
  - generation: the peak of the `model.generate` call `generation.transformers.sample_groups` makes, every row
    generating the full budget.
Each is within 25 % of `run_phases(cfg, shape, "cpu")` for the same shapes; and every term of the estimate is
needed: without it the estimate misses the measurement by more than 25 % for at least one of the models.
"""
from __future__ import annotations

import pytest
import torch

from grpo_replay.loss import LossConfig
from grpo_replay.rollout import RolloutBatch
from grpo_replay.trainer.memory import generation_terms, model_shape, run_phases, update_terms
from grpo_replay.trainer.train_config import resolve
from grpo_replay.trainer.update import update

pytest.importorskip("transformers")
TOLERANCE = 0.25
PROMPT = 4  # prompt tokens per row (the testbed's estimate counts none: a few tokens)
GROUP = 4
MODELS = {  # hidden, layers, vocab, prompts per step, micro-batch rows, completion tokens
    "logits": dict(hidden=64, layers=1, vocab=32768, prompts=2, micro=8, completion=16),
    "activations": dict(hidden=128, layers=4, vocab=1024, prompts=4, micro=16, completion=16),
    "gradients": dict(hidden=256, layers=2, vocab=4096, prompts=1, micro=2, completion=16),
}


def live_peak(fn) -> tuple[int, int]:
    """(peak, end) of the bytes torch's CPU allocator holds while `fn` runs, above what it held at the start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak, live


def build(m: dict):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=3 * m["hidden"],
                         num_hidden_layers=m["layers"], num_attention_heads=4, num_key_value_heads=2,
                         head_dim=m["hidden"] // 4, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    cfg = resolve({"prompts_per_step": m["prompts"], "group_size": GROUP, "max_new_tokens": m["completion"],
                   "micro_batch_size": m["micro"], "device": "cpu"})
    return model, cfg


def batch(rows: int, completion: int, vocab: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    return RolloutBatch.fresh(
        prompt_ids=torch.randint(1, vocab, (rows, PROMPT), generator=g), prompt_mask=torch.ones(rows, PROMPT),
        completion_ids=torch.randint(1, vocab, (rows, completion), generator=g),
        completion_mask=torch.ones(rows, completion), advantages=torch.randn(rows, generator=g),
        rewards=torch.rand(rows, generator=g), group_ids=torch.arange(rows) // GROUP, group_std=torch.ones(rows),
        step=0, behaviour_logps=-torch.rand(rows, completion, generator=g))


def measure(m: dict) -> dict:
    model, cfg = build(m)
    rows = m["prompts"] * GROUP
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    b = batch(rows, m["completion"], m["vocab"])
    _, moments = live_peak(lambda: update(model, opt, sched, b, LossConfig(), cfg))
    update_peak, _ = live_peak(lambda: update(model, opt, sched, b, LossConfig(), cfg))
    ids = torch.randint(1, m["vocab"], (m["prompts"], PROMPT))
    with torch.no_grad():  # sample_groups' call, every row generating the whole budget
        generation, _ = live_peak(lambda: model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=m["completion"],
            min_new_tokens=m["completion"], num_return_sequences=GROUP, do_sample=True, temperature=1.0, top_k=0,
            top_p=1.0, pad_token_id=0, eos_token_id=None, use_cache=True))
    shape = model_shape(model)
    estimate = run_phases(cfg, shape, "cpu")
    return {"measured": {"adamw": moments, "update": update_peak, "generation": generation},
            "estimate": {"adamw": estimate.adamw, "update": estimate.update, "generation": estimate.generation},
            "terms": {"adamw": {"moments": estimate.adamw},
                      "update": update_terms(shape, micro_rows=m["micro"], tokens=m["completion"], precision="fp32"),
                      "generation": generation_terms(shape, rows, m["completion"])}}


@pytest.fixture(scope="module")
def measured():
    torch.set_num_threads(max(1, torch.get_num_threads()))
    return {name: measure(m) for name, m in MODELS.items()}


def off(estimate: int, measured: int) -> float:
    return abs(estimate - measured) / measured


def test_the_estimate_is_within_25_percent_of_the_measured_peak_per_phase(measured):
    rows = {name: {phase: (r["measured"][phase], r["estimate"][phase], round(off(r["estimate"][phase],
                                                                                  r["measured"][phase]), 3))
                   for phase in r["measured"]} for name, r in measured.items()}
    print(rows)
    for name, r in measured.items():
        for phase, (got, want, error) in rows[name].items():
            assert sum(r["terms"][phase].values()) == r["estimate"][phase]  # the terms are the phase
            assert error <= TOLERANCE, (name, phase, got, want, rows)


def test_every_term_of_the_estimate_is_needed(measured):
    """Dropping any one term (AdamW's moments, the gradients, the logits, the activations, the KV cache, the
    decoding step's logits) puts the estimate more than 25 % off the measurement for at least one model."""
    missed = {}
    for phase in ("adamw", "update", "generation"):
        for term in next(iter(measured.values()))["terms"][phase]:
            missed[(phase, term)] = max(off(r["estimate"][phase] - r["terms"][phase][term], r["measured"][phase])
                                        for r in measured.values())
    needed = {k: v for k, v in missed.items() if k[1] != "bf16 weight copies"}  # zero in float32 on a CPU
    assert all(v > TOLERANCE for v in needed.values()), missed
