"""The step-memory estimate on the GPU recipe's shapes (docs/paper_table.md), by phase: what the trainer refuses
before vLLM starts, that the evaluation is counted where it runs, and that the per-token activation bytes are the
ones autograd saves in Qwen3 layers. Shapes are the models' config.json values; nothing is allocated."""
import dataclasses
from types import SimpleNamespace

import pytest

from grpo_replay.preflight.shapes import KNOWN, shape_from_config
from grpo_replay.trainer.memory import (ACTIVATION_BYTES, Shape, eval_chunk, generation_terms, run_phases, trl_logits,
                                        update_terms)
from grpo_replay.trainer.train_config import resolve

GIB = 2**30
CARD = {80: 81559 * 2**20, 141: 143771 * 2**20}  # nvidia-smi's memory.total of an H100 80GB and an H200

# docs/paper_table.md's recipe for the built-in trainer (and TRL's), as `compare` resolves it per run
RECIPE = {"reward": "math", "data": "math_train.jsonl", "prompts_per_step": 128, "group_size": 8, "steps": 300,
          "max_new_tokens": 4096, "micro_batch_size": 1, "generator": "vllm", "eval_every": 50, "eval_problems": 128,
          "eval_samples": 4, "checkpoint_every": 25, "lr": 1e-6}


def recipe(size, **over):
    cfg = resolve({**RECIPE, "model": f"Qwen/Qwen3-{size}-Base", **over})
    return cfg, shape_from_config(KNOWN[cfg.model])


def total(cfg, shape, card_gb):
    return 4 * shape.params + run_phases(cfg, shape, "cuda", CARD[card_gb]).need


@pytest.mark.parametrize("size,micro,card,fits", [
    ("0.6B", 1, 80, True), ("1.7B", 1, 141, True), ("4B", 1, 80, False), ("0.6B", 16, 80, False),
    ("0.6B", 4, 80, True), ("0.6B", 5, 80, False),
])
def test_recipe_shapes(size, micro, card, fits):
    cfg, shape = recipe(size, micro_batch_size=micro)
    assert (total(cfg, shape, card) <= CARD[card]) is fits, total(cfg, shape, card) / GIB


def test_the_kv_width_is_kv_heads_times_head_dim():
    """Qwen3-0.6B: 8 KV heads of head_dim 128 (1,024 values per token and layer), not hidden / heads x kv heads
    (512)."""
    _, shape = recipe("0.6B")
    assert shape.kv_width == 8 * 128
    assert shape.kv_bytes(rows=3, tokens=5, elem=4) == 3 * 28 * 2 * 5 * 1024 * 4


def test_the_evaluation_through_transformers_is_counted_and_sized_to_fit():
    """The recipe's step-0 evaluation: 128 problems x 4 samples x 4,096 tokens of KV cache is about 224 GiB at 0.6B.
    Where it runs through transformers (TRL's backend, or generator=transformers) the estimate counts it, and on a
    GPU the problems per call are cut so that it stays within the largest other phase; under the built-in
    trainer's vLLM it is inside vLLM's share."""
    cfg, shape = recipe("0.6B")
    whole = shape.kv_bytes(rows=128 * 4, tokens=4096, elem=4)
    assert whole > 200 * GIB
    assert run_phases(cfg, shape, "cuda", CARD[80]).evaluation == 0  # built-in + vLLM: in the engine's share
    for variant in (dict(backend="trl", micro_batch_size=2), dict(generator="transformers")):
        c = dataclasses.replace(cfg, **variant)
        ph = run_phases(c, shape, "cuda", CARD[80])
        chunk = eval_chunk(c, shape, "cuda", CARD[80])
        assert ph.evaluation == sum(generation_terms(shape, min(chunk, 128) * 4, 4096).values()) > 0
        assert ph.evaluation <= max(ph.generation, ph.scoring, ph.update)
        if c.generator == "vllm":  # rollouts in vLLM: the evaluation alone would set the peak, so it is cut
            assert 1 <= chunk < 128
    # on a CPU the chunk stays the evaluation's fixed 256 problems and the whole batch is counted
    c = dataclasses.replace(cfg, generator="transformers")
    assert eval_chunk(c, shape, "cpu") == 256
    assert run_phases(c, shape, "cpu").evaluation == whole + 4 * 128 * 4 * shape.vocab * 4  # + one step's logits


def test_trl_micro_batches_hold_the_replay_rows_too():
    """TRL splits the composed rows (fresh + replay) into steps_per_generation forwards: with ratio 0.5 each holds
    1.5 x micro_batch_size rows, and the estimate's update phase is that of 3 rows at micro_batch_size=2 (with
    TRL's fused LM head in place of the built-in trainer's logits chunk)."""
    cfg, shape = recipe("0.6B", micro_batch_size=2)
    trl = run_phases(dataclasses.replace(cfg, backend="trl"), shape, "cuda", CARD[80])
    three = update_terms(shape, micro_rows=3, tokens=256 + 4096, precision="bf16")
    assert trl.update == sum(three.values()) - three["logits"] + trl_logits(shape, 3 * 4096, "bf16")


def saved_bytes_per_token_and_layer(h: int, i: int, heads: int, kv: int, autocast: bool,
                                    dtype: str = "float32") -> float:
    """What a Qwen3 decoder layer of these shapes keeps for the backward pass per token: the bytes of the tensors
    autograd saves (parameters excluded), one layer's difference, between 128 and 256 tokens (so the bf16 copies of
    the weights autocast makes, which do not grow with the tokens, cancel out)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=128, hidden_size=h, intermediate_size=i, num_hidden_layers=2, num_attention_heads=heads,
                      num_key_value_heads=kv, head_dim=128)
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    layers = model.model.layers

    def saved(n_layers: int, tokens: int) -> int:
        model.model.layers = layers[:n_layers]
        params = {p.data_ptr() for p in model.parameters()}
        seen: dict[int, int] = {}

        def pack(t):
            if t.data_ptr() not in params:
                seen[t.data_ptr()] = t.numel() * t.element_size()
            return t

        ids = torch.randint(0, 128, (1, tokens))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
        return sum(seen.values())

    per_layer = [saved(2, t) - saved(1, t) for t in (128, 256)]
    return (per_layer[1] - per_layer[0]) / 128


@pytest.mark.parametrize("precision", ["bf16", "bf16-weights", "fp32"])
def test_the_activation_bytes_are_what_a_qwen3_layer_keeps(precision):
    """The estimate's per-token, per-layer bytes (26 h + 8 i + 10 (q + kv) under bf16 autocast, 16 / 8 / 10 with bf16
    weights as FSDP's mixed precision runs them, 24 / 16 / 16 in float32) match what autograd saves in a
    Qwen3-0.6B-shaped layer within 2 %."""
    cfg = KNOWN["Qwen/Qwen3-0.6B-Base"]
    shape = shape_from_config(cfg)
    measured = saved_bytes_per_token_and_layer(cfg["hidden_size"], cfg["intermediate_size"],
                                               cfg["num_attention_heads"], cfg["num_key_value_heads"],
                                               autocast=precision == "bf16",
                                               dtype="bfloat16" if precision == "bf16-weights" else "float32")
    assert abs(shape.activation_bytes(precision) - measured) <= 0.02 * measured, (shape.activation_bytes(precision), measured)


def test_shape_reads_head_dim_from_a_config_and_falls_back_to_hidden_over_heads():
    c = SimpleNamespace(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=128, vocab_size=100)
    assert Shape.of(c, 10).head_dim == 16
    assert Shape.of(SimpleNamespace(**vars(c), head_dim=32), 10).kv_width == 64
    assert set(ACTIVATION_BYTES) == {"bf16", "bf16-weights", "fp32"}


def test_the_docs_table_of_what_fits_where_is_this_estimate():
    """docs/paper_table.md's memory table, every cell, from the estimate the trainer checks (so the docs and the
    check cannot disagree, e.g. on Qwen3-4B on a 141 GB card)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "paper_table.md").read_text()
    section = doc.split("**What fits where")[1].split("### verl")[0]
    rows = {m.group(1): [float(x) for x in re.findall(r"\d+(?:\.\d+)?", m.group(2))]
            for m in re.finditer(r"^\| (Qwen3-[\d.]+B)-Base \|(.*)\|$", section, re.M)}
    assert set(rows) == {"Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B"}
    for name, printed in rows.items():
        size = name.split("-")[1]
        cfg, shape = recipe(size)
        one = run_phases(cfg, shape, "cuda", CARD[80])
        two = run_phases(dataclasses.replace(cfg, micro_batch_size=2), shape, "cuda", CARD[80])
        fit = [max([m for m in range(1, 33) if total(recipe(size, micro_batch_size=m)[0], shape, c) <= CARD[c]] or [0])
               for c in (80, 141)]
        want = [16 * shape.params / GIB, (two.update - one.update) / GIB, 0.3 * CARD[80] / GIB, 0.3 * CARD[141] / GIB,
                total(cfg, shape, 80) / GIB, total(cfg, shape, 141) / GIB]
        assert printed == [round(w, 1) for w in want] + fit, (name, printed, want, fit)
