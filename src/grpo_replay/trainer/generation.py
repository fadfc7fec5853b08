"""Sampling completions and scoring tokens: the two places the trainer touches the model.

`generate` samples G completions per prompt with behaviour-policy settings (temperature, no top-k/top-p,
so the log-probs below are exactly the sampling distribution's). `token_logps` computes log pi(token) of
completions given prompts in one forward pass. Both take left-padded prompts and right-padded completions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..rollout import mask_lengths


@dataclass
class Generation:
    """On the host in the narrow form the replay buffer stores (rollout.py): int32 ids, bool masks."""

    prompt_ids: torch.Tensor  # (B*G, P) int32, left-padded, rows i*G..i*G+G-1 belong to prompt i
    prompt_mask: torch.Tensor  # (B*G, P) bool
    completion_ids: torch.Tensor  # (B*G, C) int32, right-padded
    completion_mask: torch.Tensor  # (B*G, C) bool: True up to and including the first EOS
    texts: list[str]  # decoded completions, cut at the first EOS


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
def generate(
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
    return _narrow(
        prompt_ids.repeat_interleave(group_size, 0), prompt_mask.repeat_interleave(group_size, 0), comp, mask,
        decode(tokenizer, comp, mask),
    )


def _narrow(prompt_ids, prompt_mask, completion_ids, completion_mask, texts) -> Generation:
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


def completion_logits(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(B, C, V) float32 logits / temperature: position t is the distribution of completion token t given its prefix."""
    device = next(model.parameters()).device
    # Ids and masks may arrive narrow (int32, bool: rollout.py); the model and torch.gather get int64.
    ids = torch.cat([prompt_ids, completion_ids], 1).to(device).long()  # (B, P + C)
    # Attend to real prompt tokens and every completion position up to the last counted one.
    comp_real = (torch.arange(completion_ids.shape[1]).unsqueeze(0) < mask_lengths(completion_mask.cpu()).unsqueeze(1)).long()
    attn = torch.cat([prompt_mask.ne(0).long(), comp_real], 1).to(device)  # (B, P + C)
    pos = (attn.cumsum(1) - 1).clamp(min=0)  # (B, P + C) positions skip the left padding
    P, C = prompt_ids.shape[1], completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits  # (B, P+C, V)
    return logits[:, P - 1 : P + C - 1].float() / temperature  # (B, C, V): position t predicts token t+1


def token_logps(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(B, C) log pi(completion token | prefix) at `temperature`; padding positions hold 0."""
    logits = completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature)  # (B, C, V)
    tok = completion_ids.to(logits.device).long().unsqueeze(-1)  # (B, C, 1)
    logp = logits.gather(-1, tok).squeeze(-1) - torch.logsumexp(logits, -1)  # (B, C)
    return logp * completion_mask.to(logits.device)


class TransformersGenerator:
    """Sampling with HF generate (KV cache); reads the live policy, so nothing to sync after an update."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def __call__(self, prompts: Sequence[str], group_size: int, max_new_tokens: int, temperature: float) -> Generation:
        return generate(self.model, self.tokenizer, prompts, group_size, max_new_tokens, temperature)

    def sync(self) -> None:
        pass


class VLLMGenerator:
    """Sampling with an in-process vLLM engine colocated on the policy's GPU (optional extra `vllm`).

    Same contract as `generate`. After every optimizer step `sync()` copies the policy weights into the engine
    (the way TRL's colocate mode does), so rollouts always come from the current policy. Not exercised by the
    test suite (no GPU there)."""

    def __init__(self, model, tokenizer, max_model_len: int, seed: int, gpu_memory_utilization: float = 0.3):
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("TrainConfig.generator='vllm' needs vLLM (GPU only): pip install vllm, or pip install -e '.[vllm]' in a grpo-replay checkout") from e
        import os

        # A single-process "external launcher" engine shares this process's GPU and needs these set.
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):
            os.environ.setdefault(k, v)
        self.model, self.tokenizer, self.seed = model, tokenizer, seed
        self.llm = LLM(
            model=model.name_or_path,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            distributed_executor_backend="external_launcher",
            seed=seed,
            logprobs_mode="processed_logprobs",
        )
        self._calls = 0

    def __call__(self, prompts: Sequence[str], group_size: int, max_new_tokens: int, temperature: float) -> Generation:
        from vllm import SamplingParams

        self._calls += 1
        params = SamplingParams(
            n=group_size, temperature=temperature, top_k=-1, top_p=1.0, max_tokens=max_new_tokens, seed=self.seed + self._calls
        )
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
        return _narrow(
            prompt_ids.repeat_interleave(group_size, 0), prompt_mask.repeat_interleave(group_size, 0),
            comp * mask + pad * (1 - mask), mask, decode(self.tokenizer, comp, mask),
        )

    def sync(self) -> None:
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        for name, param in self.model.named_parameters():
            runner.model.load_weights([(name, param.data)])
        self.llm.reset_prefix_cache()
