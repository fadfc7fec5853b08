"""Sampling completions: one interface, with a transformers and a vLLM backend, used by the trainer, the
evaluation harness and the testbed.

A backend is a `Generator`:
- `sample(prompts, group_size, max_new_tokens, temperature, seed=None) -> Generation`: G completions per prompt as
  token tensors in the replay buffer's narrow form, drawn from the exact sampling distribution (no top-k, no
  top-p), so the behaviour log-probs the trainer computes are those of the distribution that drew them;
  temperature 0 decodes greedily; `seed` gives the call a seed of its own (transformers: torch's generator,
  seeded under a fork);
- `generate(prompts, params, seed) -> list[list[Completion]]`: `params.n` completions per prompt as text with
  their token counts, with the evaluation's settings (temperature, top-p) under its own seed;
- `sync()`: make the engine sample from the policy's current weights (a no-op for a backend that reads the live
  model).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol, Sequence

import torch

from ..errors import UsageError

BACKENDS = ("transformers", "vllm")


@dataclass
class Generation:
    """On the host in the narrow form the replay buffer stores (rollout.py): int32 ids, bool masks."""

    prompt_ids: torch.Tensor  # (B*G, P) int32, left-padded, rows i*G..i*G+G-1 belong to prompt i
    prompt_mask: torch.Tensor  # (B*G, P) bool
    completion_ids: torch.Tensor  # (B*G, C) int32, right-padded
    completion_mask: torch.Tensor  # (B*G, C) bool: True up to and including the first EOS
    texts: list[str]  # decoded completions, cut at the first EOS


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by both backends (temperature 0 means greedy decoding)."""

    n: int = 16
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise UsageError(f"n (samples per problem) must be >= 1, got {self.n}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):  # nan < 0 is False: test what is allowed
            raise UsageError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.temperature == 0 and self.n > 1:
            # Greedy decoding has one answer per prompt: n copies of it would inflate pass@k's sample count and
            # transformers refuses num_return_sequences > 1 without sampling.
            raise UsageError(f"n={self.n} with temperature=0 (greedy decoding, one completion per problem); allowed: "
                             f"n=1 with temperature 0, or a temperature > 0 to sample n completions")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise UsageError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Completion:
    text: str
    num_tokens: int


class Generator(Protocol):
    """A sampling backend (see the module docstring)."""

    def sample(self, prompts: Sequence[str], group_size: int, max_new_tokens: int, temperature: float,
               seed: int | None = None) -> Generation:
        ...

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[list[Completion]]:
        ...

    def sync(self) -> None:
        ...


__all__ = ["BACKENDS", "Completion", "Generation", "Generator", "SamplingParams"]
