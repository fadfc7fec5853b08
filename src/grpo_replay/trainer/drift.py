"""Policy-drift diagnostic: how far the policy moves per step, on a fixed probe set (`TrainConfig.drift_probe`).

Why: age eviction bounds a replayed rollout's staleness in *steps*; what that means for the PPO ratio depends on how
far the policy moves per step. A tiny model at lr 2e-4 may move much more per step than a billion-parameter model at
lr 1e-6, so the testbed's `replay/ratio_*` and `replay/clip_frac` are only comparable with a real run's once the
per-step drift is known. This module measures it.

The probe: the first `drift_probe` held-out prompts (cycled when there are fewer), one completion each, sampled once
from the initial policy (forked torch RNG, seed `cfg.seed + DRIFT_SEED_OFFSET`, so the training run is unchanged) and
then kept fixed. At the start of step t the policy pi_t (the one that makes step t's update) runs teacher-forced over
the probe, and its next-token log-probabilities over the whole vocabulary at every completion position are kept for
the largest lag's steps: log-probs only, never a model copy.

    drift/kl_<name> at step t = mean over the probe's completion tokens c of
        KL(pi_t(.|c) || pi_{t-k}(.|c)) = sum_v pi_t(v|c) * (log pi_t(v|c) - log pi_{t-k}(v|c))

computed exactly over the vocabulary (no sampling estimator): >= 0, and 0 when the policy did not change at those
contexts. k = 1 (`drift/kl_1`) and k = replay.tau_max (`drift/kl_tau`, the lag of the oldest row replay may use);
None until step t >= k. In the metrics row of step t they sit beside `replay/ratio_mean`, `replay/ratio_max` and
`replay/clip_frac`, which that step's update measured with the same pi_t against each replayed row's birth policy.

Memory: drift_probe x completion tokens x vocabulary x 4 bytes per kept step (the testbed's default budget and
22-token vocabulary: 64 rows, about 70 KB a step); `check_memory` refuses more than MAX_BYTES.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import torch

from ..generation.transformers import sample_groups
from .logprobs import completion_logits

DRIFT_SEED_OFFSET = 4242  # probe sampling seed = cfg.seed + this: a stream apart from training and evaluation
MAX_BYTES = 2 << 30  # kept log-probs above this are refused (a large vocabulary: lower drift_probe)
_ROWS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")


class DriftProbe:
    """The fixed probe rows and the recent policies' log-probs on them; `measure(model, t)` once per step."""

    def __init__(self, rows: Mapping[str, torch.Tensor], lags: Mapping[str, int], temperature: float = 1.0,
                 micro_batch: int = 0):
        self.rows = {k: rows[k].cpu() for k in _ROWS}  # (N, P) / (N, C) long
        self.lags = dict(lags)  # metric name -> k (steps back)
        self.temperature = temperature
        self.micro_batch = micro_batch
        self.history: dict[int, torch.Tensor] = {}  # step -> (N, C, V) float32 log-probs of pi_step

    @classmethod
    def build(cls, model, tokenizer, prompts: Sequence[str], n: int, max_new_tokens: int, temperature: float, seed: int,
              lags: Mapping[str, int], micro_batch: int = 0) -> "DriftProbe":
        """n probe rows: prompts cycled, one completion each sampled from `model` under a forked RNG seeded `seed`."""
        chosen = [prompts[i % len(prompts)] for i in range(n)]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            g = sample_groups(model, tokenizer, chosen, 1, max_new_tokens, temperature)
        rows = {"prompt_ids": g.prompt_ids, "prompt_mask": g.prompt_mask,
                "completion_ids": g.completion_ids, "completion_mask": g.completion_mask}
        return cls(rows, lags, temperature, micro_batch)

    @property
    def keep(self) -> int:
        """Steps of log-probs kept: the largest lag."""
        return max(self.lags.values())

    def bytes_per_step(self, vocab_size: int) -> int:
        n, c = self.rows["completion_ids"].shape
        return n * c * vocab_size * 4

    def check_memory(self, vocab_size: int) -> None:
        need = self.bytes_per_step(vocab_size) * self.keep
        if need > MAX_BYTES:
            n, c = self.rows["completion_ids"].shape
            raise ValueError(
                f"TrainConfig.drift_probe={n} would keep {need / 2**30:.1f} GiB of log-probs ({n} rows x {c} tokens x "
                f"{vocab_size} vocabulary x 4 B x {self.keep} steps; limit {MAX_BYTES / 2**30:.0f} GiB); "
                "allowed: a smaller drift_probe, or 0 (off)"
            )

    @torch.no_grad()
    def logprobs(self, model) -> torch.Tensor:
        """(N, C, V) float32 log pi(. | prefix) at every completion position, in eval mode (no dropout), on CPU."""
        was_training = model.training
        model.eval()
        N = self.rows["completion_ids"].shape[0]
        mb = self.micro_batch or N
        parts = []
        try:
            for i in range(0, N, mb):
                r = {k: v[i : i + mb] for k, v in self.rows.items()}
                logits = completion_logits(model, r["prompt_ids"], r["prompt_mask"], r["completion_ids"],
                                           r["completion_mask"], self.temperature)
                parts.append(torch.log_softmax(logits, -1).cpu())
        finally:
            model.train(was_training)
        return torch.cat(parts)

    def measure(self, model, t: int) -> dict[str, Optional[float]]:
        """{"drift/kl_<name>": KL(pi_t || pi_{t-k}) or None} for the policy `model` at step t; remembers pi_t."""
        cur = self.logprobs(model)
        mask = self.rows["completion_mask"].bool()
        out = {f"drift/kl_{name}": (kl_mean(cur, self.history[t - k], mask) if (t - k) in self.history else None)
               for name, k in self.lags.items()}
        self.history[t] = cur
        self.history = {s: v for s, v in self.history.items() if s > t - self.keep}
        return out

    # -- checkpoint: everything as plain tensors (safetensors) ---------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**{f"probe.{k}": v.contiguous() for k, v in self.rows.items()},
                **{f"logp.{s}": v.contiguous() for s, v in self.history.items()}}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.rows = {k: state[f"probe.{k}"] for k in _ROWS}
        self.history = {int(k.split(".", 1)[1]): v for k, v in state.items() if k.startswith("logp.")}


def kl_mean(logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over mask's positions of KL(p || q) = sum_v p (log p - log q); logp, logq (N, C, V), mask (N, C) bool.
    Computed in float64 and clamped at 0 (rounding must not make it negative)."""
    if not mask.any():
        return 0.0
    lp, lq = logp[mask].double(), logq[mask].double()  # (T, V)
    kl = (lp.exp() * (lp - lq)).sum(-1)  # (T,)
    v = float(kl.mean())
    return max(0.0, v) if math.isfinite(v) else v


def lags_for(tau_max: Optional[int]) -> dict[str, int]:
    """k = 1 always; k = tau_max when it is an integer >= 1 (no eviction by age: no drift/kl_tau)."""
    lags = {"1": 1}
    if tau_max is not None and tau_max >= 1:
        lags["tau"] = int(tau_max)
    return lags
