"""A stand-in for the `vllm` module on CPU: `LLM(model=folder)` loads that checkpoint with transformers and samples
from it token by token; `load_weights` (reached as vLLM's model runner's) copies pushed tensors into it by name,
refusing an unknown name (vLLM's params_dict lookup), another shape or a non-floating tensor. So a run that
generates with it samples from the weights it was last synced to, as the colocated engine does. Every `generate`
is recorded (temperature, seed, prompts) for the test to read."""
from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import torch


class FakeLLM:
    instances: list["FakeLLM"] = []

    def __init__(self, model, seed=0, **kw):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.params = dict(self.model.named_parameters())
        self.calls: list[dict] = []
        self.syncs = 0
        runner = SimpleNamespace(model=SimpleNamespace(load_weights=self._load))
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner)))
        FakeLLM.instances.append(self)

    def _load(self, weights):
        for name, t in weights:
            if name not in self.params:
                raise KeyError(f"{name!r}: the engine's model has no such parameter")
            if t.shape != self.params[name].shape or not t.is_floating_point():
                raise ValueError(f"{name}: {tuple(t.shape)} {t.dtype} into {tuple(self.params[name].shape)}")
            with torch.no_grad():
                self.params[name].copy_(t)
        self.syncs += 1

    def reset_prefix_cache(self):
        pass

    @torch.no_grad()
    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append({"temperature": params.temperature, "seed": params.seed, "prompts": len(prompts),
                           "n": params.n})
        g = torch.Generator().manual_seed(int(params.seed or 0))
        eos = self.tokenizer.eos_token_id
        outs = []
        for p in prompts:
            ids = list(p["prompt_token_ids"]) if isinstance(p, dict) else self.tokenizer(p)["input_ids"]
            comps = []
            for _ in range(params.n):
                seq: list[int] = []
                for _ in range(params.max_tokens):
                    logits = self.model(input_ids=torch.tensor([ids + seq])).logits[0, -1].float()
                    if params.temperature == 0:
                        tok = int(logits.argmax())
                    else:
                        tok = int(torch.multinomial(torch.softmax(logits / params.temperature, -1), 1, generator=g))
                    seq.append(tok)
                    if tok == eos:
                        break
                comps.append(SimpleNamespace(token_ids=seq, text=self.tokenizer.decode(seq, skip_special_tokens=True)))
            outs.append(SimpleNamespace(outputs=comps))
        return outs


def install(monkeypatch) -> type[FakeLLM]:
    """`import vllm` gives the stand-in for the rest of the test; the launch variables the colocated engine sets
    (RANK, MASTER_PORT, ...) are put back after it, so no later test or child process joins that group."""
    from helpers import LAUNCH_VARS, restore_after

    restore_after(monkeypatch, *LAUNCH_VARS)
    fake = types.ModuleType("vllm")
    fake.LLM = FakeLLM
    fake.SamplingParams = lambda **kw: SimpleNamespace(**{"seed": None, **kw})
    monkeypatch.setitem(sys.modules, "vllm", fake)
    FakeLLM.instances = []
    return FakeLLM
