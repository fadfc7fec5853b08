"""Checks (b) and (d): the built-in trainer's step at the paper recipe's per-GPU shapes, on Qwen3-shaped models with
random weights (built from a Qwen3Config with the hub configs' values, preflight/shapes.py; nothing downloaded),
CUDA peak memory per phase beside `grpo-replay preflight`'s estimate for the same launch (trainer/memory.run_phases
on preflight/shapes.model_shape, the calls the preflight makes).

Each phase runs the trainer's own code on one micro-batch of micro_batch_size rows of PROMPT_ROOM prompt + 4,096
completion tokens (the recipe's update forward), with torch.cuda.max_memory_allocated reset before it and the memory
allocated at its start subtracted, so each figure is what the phase adds on top of what was resident:
  weights     the float32 model (estimate: 4 bytes per parameter)
  scoring     a no-grad `token_logps` pass as the trainer scores (estimate: the scoring phase; check (d))
  update 1    `update()`: forward, backward, AdamW's first step, which creates its moments (estimate: update + adamw)
  moments     what update 1 left resident (estimate: adamw, 8 bytes per parameter)
  update 2    `update()` again, moments resident (estimate: the update phase)
  the step    the highest peak of all of these, weights included (estimate: the preflight's total without vLLM's share)
Generation is not measured: the recipe generates in vLLM, inside vLLM's share of the card, which this check does not
start. On a CPU (the dry run) the steps run and no peak is measured (torch's allocator statistics are CUDA's).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ...trainer import memory
from ..shapes import KNOWN, model_shape, shape_from_config
from .report import Result

GIB = 2**30
SIZES = {"0.6B": "Qwen/Qwen3-0.6B-Base", "1.7B": "Qwen/Qwen3-1.7B-Base"}
# docs/paper_table.md's built-in recipe, per GPU (one run per card): the keys that set a step's memory.
PAPER_LAUNCH = {"reward": "math", "data": "word_sums", "prompts_per_step": 128, "group_size": 8,
                "max_new_tokens": 4096, "micro_batch_size": 1, "generator": "vllm", "eval_every": 50,
                "eval_problems": 128, "device": "cuda"}
TINY_CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 512, "tie_word_embeddings": True,
               "hidden_act": "silu"}
TINY_LAUNCH = {**PAPER_LAUNCH, "max_new_tokens": 24, "prompts_per_step": 2, "group_size": 2,
               "generator": "transformers", "device": "cpu"}


def launch(size: str, tiny: bool):
    """(TrainConfig of the launch, its Shape as the preflight finds it, the Qwen3Config values)."""
    from ...trainer.train_config import resolve

    if tiny:
        return resolve(TINY_LAUNCH), shape_from_config(TINY_CONFIG), TINY_CONFIG
    cfg = resolve({**PAPER_LAUNCH, "model": SIZES[size]})
    shape, _ = model_shape(cfg.model)
    return cfg, shape, KNOWN[SIZES[size]]


def build_model(values: dict, device: torch.device):
    """A float32 Qwen3 causal LM with random weights, initialised on `device`."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen3Config(**values), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.train()
    return model


def make_batch(rows: int, prompt: int, completion: int, vocab: int):
    """A fresh RolloutBatch of `rows` full-length rows with random tokens and advantages of both signs."""
    from ...rollout import RolloutBatch

    g = torch.Generator().manual_seed(0)
    adv = torch.tensor([1.0, -1.0]).repeat((rows + 1) // 2)[:rows]
    return RolloutBatch.fresh(
        prompt_ids=torch.randint(1, vocab, (rows, prompt), generator=g), prompt_mask=torch.ones(rows, prompt, dtype=torch.long),
        completion_ids=torch.randint(1, vocab, (rows, completion), generator=g),
        completion_mask=torch.ones(rows, completion, dtype=torch.long), advantages=adv, rewards=(adv > 0).float(),
        group_ids=torch.zeros(rows, dtype=torch.long), group_std=torch.ones(rows), step=0)


def measured(device: torch.device, fn: Callable[[], Any], top: Optional[list] = None
             ) -> tuple[Any, Optional[int], Optional[int]]:
    """(fn's value, peak bytes above the start, bytes left resident above the start); None, None on a CPU. `top`
    (a one-element list) keeps the highest absolute peak seen."""
    if device.type != "cuda":
        return fn(), None, None
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    value = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    if top is not None:
        top[0] = max(top[0], peak)
    return value, peak - start, torch.cuda.memory_allocated(device) - start


def _row(size: str, phase: str, got: Optional[int], estimate: int) -> dict[str, Any]:
    ratio = None if got is None else got / estimate if estimate else None
    return {"model": size, "phase": phase, "measured GiB": None if got is None else got / GIB,
            "preflight GiB": estimate / GIB, "measured / preflight": ratio}


def _free(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_memory(res: Result, device: torch.device, sizes: list[str], tiny: bool) -> None:
    """Check (b): rows per model and phase (module docstring)."""
    from ...loss import LossConfig
    from ...trainer.logprobs import token_logps
    from ...trainer.update import forward_precision, update

    for size in sizes:
        cfg, shape, values = launch(size, tiny)
        ph = memory.run_phases(cfg, shape, "cuda", _card(device))
        C, P = cfg.completion_budget(), memory.PROMPT_ROOM
        model, _, weights = measured(device, lambda: build_model(values, device))  # resident, not init's peak
        params = sum(p.numel() for p in model.parameters())
        batch = make_batch(cfg.micro_batch_size, P, C, values["vocab_size"])
        loss_cfg = LossConfig(**{**cfg.loss.__dict__, "max_completion_length": C})
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)

        def score():
            with torch.no_grad(), forward_precision(model, cfg):
                return token_logps(model, *(t.to(device) for t in (batch.prompt_ids, batch.prompt_mask,
                                                                  batch.completion_ids, batch.completion_mask)))

        top = [0]
        _, scoring, _ = measured(device, score, top)
        out1, first, moments = measured(device, lambda: update(model, opt, sched, batch, loss_cfg, cfg), top)
        out2, second, _ = measured(device, lambda: update(model, opt, sched, batch, loss_cfg, cfg), top)
        if not (out1["finite"] and out2["finite"]):
            raise RuntimeError(f"{size}: a non-finite loss in the update ({out1['loss']}, {out2['loss']})")
        res.rows += [_row(size, "weights", weights, 4 * shape.params), _row(size, "scoring", scoring, ph.scoring),
                     _row(size, "update 1 (AdamW's moments created)", first, ph.update + ph.adamw),
                     _row(size, "moments (resident after update 1)", moments, ph.adamw),
                     _row(size, "update 2", second, ph.update),
                     # the step's whole peak (weights included) beside the preflight's total less vLLM's share
                     _row(size, "the step (weights + AdamW + largest phase)", top[0] if device.type == "cuda" else None,
                          4 * shape.params + ph.need - ph.vllm)]
        res.figures[f"{size}: parameters (built / preflight's count)"] = f"{params:,} / {shape.params:,}"
        res.figures[f"{size}: losses of the two updates"] = f"{out1['loss']:.4g}, {out2['loss']:.4g}"
        if not tiny:
            res.figures[f"{size}: the launch"] = (f"grpo-replay train --model {SIZES[size]} " + " ".join(
                f"--set {k}={v}" for k, v in PAPER_LAUNCH.items() if k != "device"))
        del model, opt, sched, out1, out2
        _free(device)
    above = [f"{r['model']} {r['phase']}" for r in res.rows if (r["measured / preflight"] or 0) > 1]
    res.notes.append("not measured: generation (in vLLM's share of the card, which this check does not start), "
                     "the evaluation (in vLLM too) and the CUDA context (outside torch's allocator)")
    if device.type != "cuda":
        res.notes.append("peaks not measured on a CPU: torch's allocator statistics count CUDA memory only")
    if above:
        res.notes.append("ABOVE the preflight's estimate: " + ", ".join(above))


def check_scoring(res: Result, device: torch.device, sizes: list[str], tiny: bool) -> None:
    """Check (d): `token_logps` (no grad, as the trainer scores) at the update's micro-batch shape, its peak beside
    the estimate's scoring phase and the full logits it avoids."""
    from ...trainer.logprobs import chunk_tokens, token_logps
    from ...trainer.update import forward_precision

    for size in sizes:
        cfg, shape, values = launch(size, tiny)
        ph = memory.run_phases(cfg, shape, "cuda", _card(device))
        C, P = cfg.completion_budget(), memory.PROMPT_ROOM
        model = build_model(values, device)
        batch = make_batch(cfg.micro_batch_size, P, C, values["vocab_size"])

        def score():
            with torch.no_grad(), forward_precision(model, cfg):
                return token_logps(model, *(t.to(device) for t in (batch.prompt_ids, batch.prompt_mask,
                                                                  batch.completion_ids, batch.completion_mask)))

        logps, peak, _ = measured(device, score)
        if not torch.isfinite(logps).all():
            raise RuntimeError(f"{size}: non-finite log-probs")
        full = len(batch) * (P + C) * shape.vocab * 4
        row = _row(size, "scoring", peak, ph.scoring)
        row.update({"tokens per chunk": chunk_tokens(shape.vocab), "unchunked float32 logits GiB": full / GIB})
        res.rows.append(row)
        del model, logps
        _free(device)
    if device.type != "cuda":
        res.notes.append("peaks not measured on a CPU: torch's allocator statistics count CUDA memory only")


def _card(device: torch.device) -> int:
    return memory.card_bytes(device) if device.type == "cuda" else 0
