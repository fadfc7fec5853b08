"""The run lifecycle both backends share (the built-in loop and `--backend trl`): the device, the held-out
evaluation at the start, during and at the end of a run, and the summary it ends with.

The run directory itself (checked, locked, marked, config.yaml written; its logs, checkpoints and summary.json) is
`rundir.RunDir`'s; a backend trains between `HeldOut(...)` at the start and `RunDir.write_summary(summary(...))`
at the end.
"""
from __future__ import annotations

from typing import Any

import torch

from .evaluation import evaluate
from .memory import EVAL_CHUNK
from .train_config import TrainConfig

HELDOUT_SEED = 12345  # the held-out problems: one fixed set, whatever cfg.seed, so every arm and seed is scored on it
EVAL_SEED_OFFSET = 777  # evaluation sampling seed = cfg.seed + this: a stream apart from the training generators'


def resolve_device(name: str) -> torch.device:
    """TrainConfig.device as a torch device ("auto": CUDA when there is one)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("TrainConfig.device='cuda' but no CUDA device is available; allowed here: auto, cpu")
    return torch.device(name)


class HeldOut:
    """A run's held-out evaluation: the same problems, sampling settings and seed at every evaluation, so an
    evaluation never changes the training run and every arm and seed is scored alike."""

    def __init__(self, cfg: TrainConfig, tokenizer, task, generator=None, chunk: int = EVAL_CHUNK):
        """`generator`: the run's vLLM engine, which then samples the evaluation too (None: transformers' generate
        on the model, `chunk` problems per call; `memory.eval_chunk` sizes it on a GPU)."""
        self.tokenizer, self.task = tokenizer, task
        self.problems = task.heldout(cfg.eval_problems, seed=HELDOUT_SEED)
        self.kw = dict(n_samples=cfg.eval_samples, max_new_tokens=cfg.completion_budget(), temperature=cfg.temperature,
                       seed=cfg.seed + EVAL_SEED_OFFSET, chunk=chunk)
        self.generator = generator

    def __call__(self, model) -> dict[str, Any]:
        return evaluate(model, self.tokenizer, self.task, self.problems, generator=self.generator, **self.kw)


def summary(cfg: TrainConfig, *, generated: int, start: dict, end: dict, setup: dict, **extra: Any) -> dict[str, Any]:
    """The fields every run's summary.json has, in one order; `extra` adds a backend's own (after them)."""
    out = {"preset": cfg.preset, "seed": cfg.seed, "steps": cfg.steps, "generated_rollouts": generated}
    out.update({k: extra.pop(k) for k in ("backend", "skipped_nonfinite_steps") if k in extra})
    out.update({
        "heldout_acc_sampled": {"start": start["acc_sampled"], "end": end["acc_sampled"]},
        "heldout_acc_greedy": {"start": start["acc_greedy"], "end": end["acc_greedy"]},
        "final_eval": {k: v for k, v in end.items() if k != "counts"},
    })
    return {**out, **extra, "setup": setup}
