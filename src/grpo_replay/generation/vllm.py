"""The vLLM backend (optional extra `grpo-replay[vllm]`, GPU only; not exercised by the CPU test suite).

For evaluation it loads a model path. For training, `VLLMGenerator.colocated(policy, ...)` starts an in-process
engine on the policy's GPU, and `sync()` copies the policy's weights into it after every optimizer step (as TRL's
colocate mode does), so rollouts always come from the current policy.

One engine per process: `close()` tears it down (engine, model-parallel groups, torch.distributed, cached GPU
memory), and `grpo-replay compare` runs each vLLM run and evaluation in a process of its own.
"""
from __future__ import annotations

import gc
import os
import socket
from typing import Sequence

import torch

from ..errors import MissingDependency

from . import Completion, Generation, SamplingParams
from .transformers import completion_mask, decode, encode_prompts, narrow

GPU_SHARE = 0.3  # the colocated engine's gpu_memory_utilization: weights, activations and AdamW keep the rest
INSTALL_HINT = ("pip install -e '.[vllm]' in a grpo-replay checkout (vLLM 0.22-0.31, the range TRL 1.16 supports; "
                "GPU only)")


class VLLMGenerator:
    def __init__(self, model_path: str, tokenizer, add_special_tokens: bool = True, *, policy=None,
                 sample_seed: int = 0, **llm_kwargs):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise MissingDependency(f"the vLLM backend needs vLLM: {INSTALL_HINT}; or use the transformers backend") from exc
        self.llm = LLM(model=model_path, **llm_kwargs)
        self.tokenizer, self.add_special_tokens = tokenizer, add_special_tokens
        self.policy, self.seed, self._calls = policy, sample_seed, 0

    @classmethod
    def colocated(cls, policy, tokenizer, max_model_len: int, seed: int, gpu_memory_utilization: float = GPU_SHARE,
                  ) -> "VLLMGenerator":
        """An engine beside the training policy on its GPU, built from the policy's checkpoint path."""
        # A single-process "external launcher" engine shares this process's GPU and needs these set; the port is a
        # free one (a fixed port collides with the next run on the host), unless the caller chose one.
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(k, v)
        if os.environ.get("MASTER_PORT", "").strip().lower() in ("", "0", "auto"):
            os.environ["MASTER_PORT"] = str(free_port())
        return cls(policy.name_or_path, tokenizer, policy=policy, sample_seed=seed,
                   gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                   distributed_executor_backend="external_launcher", seed=seed, logprobs_mode="processed_logprobs")

    def sample(self, prompts: Sequence[str], group_size: int, max_new_tokens: int, temperature: float,
               seed: int | None = None) -> Generation:
        """`seed`: this call's own (the evaluation's), leaving the training calls' seed sequence where it was."""
        from vllm import SamplingParams as VSamplingParams

        if seed is None:
            self._calls += 1
            seed = self.seed + self._calls
        params = VSamplingParams(n=group_size, temperature=temperature, top_k=-1, top_p=1.0, max_tokens=max_new_tokens,
                                 seed=seed)
        outs = self.llm.generate(list(prompts), params, use_tqdm=False)
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        comps = [list(c.token_ids) for o in outs for c in o.outputs]
        C = max(1, max(len(c) for c in comps))
        comp = torch.full((len(comps), C), pad, dtype=torch.long)
        for i, c in enumerate(comps):
            comp[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        real = (torch.arange(C).unsqueeze(0) < torch.tensor([len(c) for c in comps]).unsqueeze(1)).long()
        mask = completion_mask(comp, eos) * real  # (N, C)
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts, "cpu")
        return narrow(
            prompt_ids.repeat_interleave(group_size, 0), prompt_mask.repeat_interleave(group_size, 0),
            comp * mask + pad * (1 - mask), mask, decode(self.tokenizer, comp, mask),
        )

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[list[Completion]]:
        from vllm import SamplingParams as VSamplingParams

        sp = VSamplingParams(n=params.n, temperature=params.temperature,
                             top_p=params.top_p if params.temperature > 0 else 1.0, max_tokens=params.max_new_tokens,
                             seed=seed)
        # Token-id prompts so BOS handling matches the transformers backend exactly.
        inputs = [{"prompt_token_ids": self.tokenizer(p, add_special_tokens=self.add_special_tokens)["input_ids"]}
                  for p in prompts]
        outputs = self.llm.generate(inputs, sp, use_tqdm=False)
        return [[Completion(text=o.text, num_tokens=len(o.token_ids)) for o in out.outputs] for out in outputs]

    def sync(self) -> None:
        if self.policy is None:
            return
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        for name, param in self.policy.named_parameters():
            runner.model.load_weights([(name, param.data)])
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Tear the engine down so that another can start in this process: vLLM keeps model-parallel groups and a
        torch.distributed group alive after the LLM object is gone."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        shutdown = getattr(getattr(llm, "llm_engine", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
        del llm
        try:
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()
        except ImportError:
            pass
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
