"""Stand-ins for the GPU parts of TRL's `AsyncGRPOTrainer`, so it trains on a CPU: an in-process rollout worker
(generates with a local copy of the policy instead of a vLLM server), a weight transfer that copies the trainer's
weights into that copy, and `enable_cpu_async_grpo()` for the two calls of the trainer that need CUDA.

    from grpo_replay.integrations.trl.async_local import InProcessRolloutWorker, CopyWeightTransfer, enable_cpu_async_grpo

    enable_cpu_async_grpo()
    worker = InProcessRolloutWorker(policy_copy, tokenizer, dataset, reward_funcs, num_generations=4, max_completion_length=8)
    trainer = ReplayAsyncGRPOTrainer(model=path, ..., rollout_worker=worker, weight_transfer=CopyWeightTransfer(policy_copy))

The worker implements TRL's `RolloutWorkerProtocol` and generates on demand: its queue makes one group (plus
`ahead` groups kept waiting, so that samples age in the queue as they do behind a vLLM server) when the trainer asks
for a sample, with the policy copy as the last weight sync left it, stamped with the model version it was told. It
runs in the trainer's thread, so a run is reproducible: group g is sampled from seed `seed + g`. Advantages and
`reward_std` are computed as TRL's `AsyncRolloutWorker` computes them; old log-probs are the copy's own log-probs of
the sampled tokens at the sampling temperature.
"""
from __future__ import annotations

import math
import queue
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

_ORIGINAL_PEAK_FLOPS: Optional[Callable] = None


def enable_cpu_async_grpo() -> None:
    """Route TRL's tree attention through a PyTorch version of the varlen flash-attention call (TRL loads an FA3 GPU
    kernel from the Hub for it), and skip the peak-FLOPs lookup (it asks CUDA for the device name) on a CPU device.
    Idempotent; a GPU run should not call it."""
    global _ORIGINAL_PEAK_FLOPS
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    packing._flash_attn = lambda: _TorchVarlen
    if _ORIGINAL_PEAK_FLOPS is None:
        _ORIGINAL_PEAK_FLOPS = async_grpo_trainer.get_peak_flops_per_device

        def peak_flops(accelerator, dtype):
            return None if accelerator.device.type == "cpu" else _ORIGINAL_PEAK_FLOPS(accelerator, dtype)

        async_grpo_trainer.get_peak_flops_per_device = peak_flops


class _TorchVarlen:
    """`flash_attn_varlen_func` in plain PyTorch (one scaled-dot-product call per segment), for tree attention."""

    @staticmethod
    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                               causal=True, window_size=(-1, -1), **_):
        """q (Nq, H, D), k/v (Nk, Hk, D) with H a multiple of Hk; segment i is rows cu_q[i]:cu_q[i+1] of q against
        rows cu_k[i]:cu_k[i+1] of k and v, causal aligned at the bottom right (as flash-attention). -> (Nq, H, D)."""
        out = torch.empty_like(q)
        rep = q.shape[1] // k.shape[1]
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for i in range(len(cq) - 1):
            qi, ki, vi = q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]]
            lq, lk = qi.shape[0], ki.shape[0]
            rows = torch.arange(lq)[:, None] + (lk - lq)
            cols = torch.arange(lk)[None, :]
            allowed = cols <= rows if causal else torch.ones(lq, lk, dtype=torch.bool)
            if window_size[0] >= 0:
                allowed &= cols >= rows - window_size[0]
            ki, vi = ki.repeat_interleave(rep, dim=1), vi.repeat_interleave(rep, dim=1)
            o = torch.nn.functional.scaled_dot_product_attention(
                qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1), attn_mask=allowed, scale=softmax_scale
            )
            out[cq[i]:cq[i + 1]] = o.transpose(0, 1)
        return out


class CopyWeightTransfer:
    """TRL's `WeightTransferProtocol`: `send_weights` copies every (name, tensor) the trainer streams into `model`
    (the rollout worker's copy of the policy). A name the copy lacks raises KeyError: a silent skip would leave the
    worker sampling from a policy the trainer never had."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.syncs = 0

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in iterator:
                if name not in params:
                    raise KeyError(f"CopyWeightTransfer: the worker's model has no parameter {name!r}")
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
        self.syncs += 1

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass


class _GeneratingQueue(queue.Queue):
    """The worker's `rollout_buffer`: a `get` that finds fewer than `ahead + 1` groups waiting generates first."""

    def __init__(self, worker: "InProcessRolloutWorker"):
        super().__init__()
        self._worker = worker

    def get(self, block: bool = True, timeout: Optional[float] = None):
        self._worker._top_up()
        return super().get(block, timeout)


class InProcessRolloutWorker:
    """TRL's `RolloutWorkerProtocol`, generating with `model` (a copy of the policy kept current by
    `CopyWeightTransfer`) in the trainer's process and thread.

    `dataset`: rows with a "prompt" string, cycled in order. `reward_funcs`: TRL-style callables
    `f(prompts=, completions=, completion_ids=, **kw) -> list[float]`, summed. `ahead`: groups generated beyond the
    one asked for, left in the queue (their samples reach the trainer one or more versions later)."""

    provides_behaviour_logps = True  # read by ReplayAsyncGRPOTrainer: old_log_probs are the sampler's own

    def __init__(self, model, tokenizer, dataset, reward_funcs: Callable | Sequence[Callable], *, num_generations: int,
                 max_completion_length: int, temperature: float = 1.0, seed: int = 0, ahead: int = 0):
        self.model, self.tokenizer, self.dataset = model, tokenizer, dataset
        self.reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        self.num_generations, self.max_completion_length = num_generations, max_completion_length
        self.temperature, self.seed, self.ahead = temperature, seed, ahead
        self.rollout_buffer = _GeneratingQueue(self)
        self.metrics_queue: queue.Queue = queue.Queue()
        self.model_version = 0
        self.next_group = 0
        self.started = False

    # --- RolloutWorkerProtocol ----------------------------------------------------------------------
    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.started = False

    def update_model_version(self, model_version: int) -> None:
        self.model_version = int(model_version)

    def check_health(self, stale_after_s: float) -> None:
        if not self.started:
            raise RuntimeError("InProcessRolloutWorker: the trainer asked for samples before start()")

    # --- checkpointing (ReplayAsyncGRPOTrainer saves and restores it) ------------------------------------
    def state_dict(self) -> dict[str, Any]:
        waiting = list(self.rollout_buffer.queue)
        return {"next_group": self.next_group, "waiting": [_sample_state(s) for s in waiting]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_group = int(state["next_group"])
        with self.rollout_buffer.mutex:
            self.rollout_buffer.queue.clear()
        for s in state["waiting"]:
            self.rollout_buffer.put_nowait(_sample_from_state(s))

    # --- generation -----------------------------------------------------------------------------------
    def _top_up(self) -> None:
        if not self.started:
            return
        while self.rollout_buffer.qsize() < (self.ahead + 1) * self.num_generations:
            for sample in self._generate_group(self.next_group):
                self.rollout_buffer.put_nowait(sample)
            self.next_group += 1

    @torch.no_grad()
    def _generate_group(self, group_id: int) -> list:
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        row = self.dataset[group_id % len(self.dataset)]
        prompt = row["prompt"]
        tok = self.tokenizer
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        G, P = self.num_generations, len(prompt_ids)
        # The row's other columns reach the reward functions, one value per completion, as TRL's worker passes them.
        columns = {k: [v] * G for k, v in row.items() if k not in ("prompt", "completion", "completion_ids")}
        inputs = torch.tensor([prompt_ids] * G)
        self.model.eval()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + group_id)
            seqs = self.model.generate(
                input_ids=inputs, attention_mask=torch.ones_like(inputs), do_sample=True, temperature=self.temperature,
                top_k=0, top_p=1.0, max_new_tokens=self.max_completion_length, pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        completions = [_until_eos(row[P:].tolist(), tok.eos_token_id) for row in seqs]
        texts = tok.batch_decode(completions, skip_special_tokens=True)
        logps = [self._logps(prompt_ids, c) for c in completions]
        rewards = np.nansum(np.array([
            [np.nan if r is None else float(r) for r in f(prompts=[prompt] * G, completions=texts, completion_ids=completions, **columns)]
            for f in self.reward_funcs
        ], dtype=float), axis=0)
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)  # as TRL's AsyncRolloutWorker
        std = float(rewards.std())
        return [
            RolloutSample(
                prompt=[{"role": "user", "content": prompt}], completion=[{"role": "assistant", "content": text}],
                input_ids=np.asarray(prompt_ids + c, dtype=np.int64),
                completion_mask=np.asarray([0] * P + [1] * len(c), dtype=np.int64),
                old_log_probs=np.asarray([0.0] * P + lp, dtype=np.float32),
                advantage=float(a), model_version=self.model_version, group_id=group_id,
                metrics={"reward": float(r), "reward_std": std},
            )
            for c, text, lp, a, r in zip(completions, texts, logps, advantages, rewards)
        ]

    def _logps(self, prompt_ids: list[int], completion: list[int]) -> list[float]:
        ids = torch.tensor([prompt_ids + completion])
        logits = self.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float() / self.temperature
        lp = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None])[:, 0]
        return lp.tolist()


def _until_eos(tokens: list[int], eos: int) -> list[int]:
    """The completion through its first eos (generate pads finished rows after it)."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


_ARRAYS = ("input_ids", "completion_mask", "old_log_probs")


def _sample_state(s) -> dict[str, Any]:
    return {"arrays": {k: torch.from_numpy(np.asarray(getattr(s, k))) for k in _ARRAYS},
            "advantage": float(s.advantage), "model_version": int(s.model_version), "group_id": int(s.group_id),
            "metrics": {k: float(v) for k, v in s.metrics.items()},
            "prompt": s.prompt[0]["content"] if s.prompt else "", "completion": s.completion[0]["content"] if s.completion else ""}


def _sample_from_state(d: dict[str, Any]):
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    metrics = {k: (math.nan if v != v else v) for k, v in d["metrics"].items()}
    return RolloutSample(prompt=[{"role": "user", "content": d["prompt"]}],
                         completion=[{"role": "assistant", "content": d["completion"]}],
                         **{k: d["arrays"][k].numpy() for k in _ARRAYS}, advantage=d["advantage"],
                         model_version=d["model_version"], group_id=d["group_id"], metrics=metrics)
