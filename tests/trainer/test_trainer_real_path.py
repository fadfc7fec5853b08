"""The built-in trainer's real-model path, through real `train()` runs on the tiny testbed."""
import math
import random
import sys
import types

import pytest
import torch

import grpo_replay.trainer.loop as loop
from grpo_replay import ReplayBuffer
from grpo_replay.trainer import checkpoint
from grpo_replay.trainer.train_config import resolve
from grpo_replay.trainer.logprobs import token_logps
from grpo_replay.trainer.setup import build_policy
from helpers import read_jsonl, without_times


def _cfg(tiny_overrides, out, **extra):
    return resolve({**tiny_overrides, "out_dir": str(out), **extra})


def test_pool_no_grad_logprob_pass_honours_micro_batch_size(tiny_overrides, tmp_path, monkeypatch):
    # Displaced fresh rows were scored in one no-grad pass over every fresh row at once.
    sizes = []  # (rows, grad enabled) of every log-prob pass

    def recording(model, prompt_ids, *a, **k):
        sizes.append((prompt_ids.shape[0], torch.is_grad_enabled()))
        return token_logps(model, prompt_ids, *a, **k)

    monkeypatch.setattr(loop, "token_logps", recording)
    cfg = _cfg(tiny_overrides, tmp_path / "run", preset="uniform_pool", steps=4, micro_batch_size=3, eval_every=0)
    loop.train(cfg)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert any(r["replay/count"] > 0 for r in rows)  # the pool displaced fresh rows at least once
    no_grad = [n for n, grad in sizes if not grad]
    assert no_grad, "the pool arm never ran its no-grad pass"
    assert max(n for n, _ in sizes) <= 3, sizes


def test_kl_to_a_frozen_reference_of_the_initial_policy(tiny_overrides, tmp_path):
    # loss.beta > 0 used to crash at the first update (no reference log-probs).
    out = tmp_path / "kl"
    cfg = _cfg(tiny_overrides, out, steps=4, checkpoint_every=2, eval_every=0, **{"loss.beta": 0.2})
    loop.train(cfg)
    rows = read_jsonl(out / "metrics.jsonl")
    updates = [r for r in rows if r["loss"] is not None]
    assert updates and all(math.isfinite(r["kl"]) and r["kl"] >= 0 for r in updates)
    assert any(r["replay/count"] > 0 for r in updates)  # replay rows carried their stored ref log-probs
    assert any(r["kl"] > 0 for r in updates[1:])  # the policy moved away from the reference

    # The stored reference log-probs are the initial policy's, not the current one's.
    initial, *_ = build_policy(cfg, torch.device("cpu"))
    final, *_ = build_policy(cfg, torch.device("cpu"))
    ck = checkpoint.latest(out)
    from safetensors.torch import load_file

    final.load_state_dict(load_file(str(ck / "model" / "model.safetensors")), strict=False)
    buf = ReplayBuffer.load(ck / "buffer", cfg.replay)
    assert len(buf) > 0
    b = buf.gather(buf.storage.valid_slots())
    assert b.ref_logps is not None
    with torch.no_grad():
        ref = token_logps(initial, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, cfg.temperature)
        now = token_logps(final, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, cfg.temperature)
    m = b.completion_mask.bool()
    assert torch.allclose(b.ref_logps[m], ref[m], atol=1e-4)
    assert not torch.allclose(b.ref_logps[m], now[m], atol=1e-4)

    # A resumed run rebuilds the same reference: its remaining steps match the uninterrupted run.
    resumed = tmp_path / "resumed"
    loop.train(_cfg(tiny_overrides, resumed, steps=2, checkpoint_every=2, eval_every=0, **{"loss.beta": 0.2}))
    loop.train(_cfg(tiny_overrides, resumed, steps=4, checkpoint_every=2, eval_every=0, **{"loss.beta": 0.2}))
    assert without_times(read_jsonl(resumed / "metrics.jsonl")) == without_times(rows)


class _FakeLLM:
    """vllm.LLM at its boundary: an engine built from the checkpoint folder `model`, holding that checkpoint's
    parameters by name, shape and its own dtype (vLLM's dtype="auto": the checkpoint's). `load_weights` takes what
    vLLM's model loader takes: a name the checkpoint has (vLLM looks each up in its parameter dict: an unknown one is
    a KeyError), the same shape, a floating tensor, copied into the engine's dtype. Every generate records whether the
    engine holds every parameter, equal to the live policy's in the engine's dtype."""

    live = None  # (model, tokenizer) of the run, captured from build_policy
    in_sync: list = []

    def __init__(self, model, seed=0, **kw):
        import json
        import os

        from safetensors import safe_open

        with safe_open(os.path.join(model, "model.safetensors"), "pt") as f:
            self.shapes = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
            dtypes = {f.get_slice(n).get_dtype() for n in f.keys()}
        declared = json.load(open(os.path.join(model, "config.json"))).get("torch_dtype")
        want = kw.get("dtype", "auto")
        self.dtype = getattr(torch, declared if want == "auto" and declared else
                             {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtypes.pop()] if want == "auto"
                             else want)
        self.held = None
        self.rng = random.Random(seed)
        runner = types.SimpleNamespace(model=types.SimpleNamespace(load_weights=self._load))
        self.llm_engine = types.SimpleNamespace(
            model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner))
        )

    def _load(self, weights):
        held = dict(self.held or {})
        for n, t in weights:
            if n not in self.shapes:
                raise KeyError(f"{n!r}: the engine's model has no such parameter (vLLM's params_dict[name])")
            if tuple(t.shape) != self.shapes[n] or not t.is_floating_point():
                raise ValueError(f"{n}: {tuple(t.shape)} {t.dtype} pushed into {self.shapes[n]} {self.dtype}")
            held[n] = t.detach().to(self.dtype).clone()
        self.held = held

    def reset_prefix_cache(self):
        pass

    def generate(self, prompts, params, use_tqdm=False):
        model, tok = _FakeLLM.live
        params_now = dict(model.named_parameters())
        _FakeLLM.in_sync.append(
            self.held is not None and set(self.held) == set(self.shapes)
            and all(torch.equal(self.held[n], p.detach().to(self.dtype)) for n, p in params_now.items())
        )
        outs = []
        for _ in prompts:
            comps = [tok.encode(str(self.rng.randint(0, 9)), add_special_tokens=False) + [tok.eos_token_id] for _ in range(params.n)]
            outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=c) for c in comps]))
        return outs


def test_vllm_engine_gets_the_restored_weights_before_the_first_step_after_resume(tiny_overrides, tmp_path, monkeypatch):
    # The engine is built before the checkpoint loads; without a sync it sampled from the base weights.
    fake = types.ModuleType("vllm")
    fake.LLM = _FakeLLM
    fake.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):
        monkeypatch.setenv(k, v)  # VLLMGenerator sets these; restored after the test
    real_build = loop.build_policy

    def capturing(cfg, device):
        res = real_build(cfg, device)
        _FakeLLM.live = (res[0], res[1])
        return res

    monkeypatch.setattr(loop, "build_policy", capturing)
    out = tmp_path / "run"
    kw = dict(generator="vllm", checkpoint_every=2, eval_every=0)
    # The engine is built from the policy's checkpoint folder: the testbed's is its warm-start cache, written by
    # the first build (a warm start made in this process has no folder yet).
    real_build(_cfg(tiny_overrides, tmp_path / "warm", **kw), "cpu")
    loop.train(_cfg(tiny_overrides, out, steps=2, **kw))
    _FakeLLM.in_sync = []
    loop.train(_cfg(tiny_overrides, out, steps=3, **kw))
    # one step after the resume, sampled from the restored weights, then the final evaluation's sampled and greedy
    # calls, which go through the engine too (synced after the step's update)
    assert _FakeLLM.in_sync == [True, True, True]
