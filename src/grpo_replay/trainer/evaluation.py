"""Held-out evaluation during training: greedy accuracy, sampled mean@n, pass@k, lengths by correctness.

Runs under a forked torch RNG with its own seed, so evaluating (or not) never changes the training run. It samples
through the run's generator when one is given (the vLLM engine of a generator=vllm run, whose KV cache lives in
vLLM's share of the card), each call with a seed of its own so the engine's training stream is not advanced;
otherwise through transformers' generate on the model, `chunk` problems at a time.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..eval.metrics import evaluate_correctness, length_split
from ..generation.transformers import sample_groups


@torch.no_grad()
def evaluate(
    model, tokenizer, task, problems: Sequence, n_samples: int, max_new_tokens: int, temperature: float, seed: int,
    chunk: int = 256, generator=None,
) -> dict:
    prompts = [p.prompt for p in problems]
    counts, lengths, correct, greedy_correct = [], [], [], []
    by_diff: dict[int, list[float]] = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for i in range(0, len(prompts), chunk):
            ps, probs = prompts[i : i + chunk], problems[i : i + chunk]
            if generator is None:
                g = sample_groups(model, tokenizer, ps, n_samples, max_new_tokens, temperature)
                gg = sample_groups(model, tokenizer, ps, 1, max_new_tokens, greedy=True)
            else:  # temperature 0: greedy decoding
                g = generator.sample(ps, n_samples, max_new_tokens, temperature, seed=seed + 2 * i)
                gg = generator.sample(ps, 1, max_new_tokens, 0.0, seed=seed + 2 * i + 1)
            lens = g.completion_mask.sum(1).tolist()
            for j, prob in enumerate(probs):
                rs = [task.reward(g.texts[j * n_samples + s], prob) for s in range(n_samples)]
                counts.append((n_samples, int(sum(r > 0 for r in rs))))
                lengths += lens[j * n_samples : (j + 1) * n_samples]
                correct += [r > 0 for r in rs]
                by_diff.setdefault(getattr(prob, "difficulty", 0), []).append(sum(rs) / n_samples)
            greedy_correct += [task.reward(t, p) > 0 for t, p in zip(gg.texts, probs)]
    ks = [k for k in (1, 2, 4, 8, 16) if k <= n_samples]
    res = evaluate_correctness(counts, ks)
    ls = length_split(lengths, correct)
    return {
        "acc_sampled": res["mean@n"],
        "acc_greedy": sum(greedy_correct) / max(len(greedy_correct), 1),
        "pass@k": {str(k): v for k, v in res["pass@k"].items()},
        "len_all": ls["all"],
        "len_correct": ls["correct"],
        "len_incorrect": ls["incorrect"],
        "acc_by_difficulty": {str(k): sum(v) / len(v) for k, v in sorted(by_diff.items())},
        "counts": [c for _, c in counts],
        "n_samples": n_samples,
    }
