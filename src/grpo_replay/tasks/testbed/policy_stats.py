"""Descriptive statistics of a policy on the testbed (group outcomes, response length, working)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from .model import generate_completions
from .task import TestbedTask


def _completion_len(ids_row: list[int], eos: int, pad: int) -> int:
    """Generated tokens up to and including the first EOS (all non-pad tokens if truncated)."""
    if eos in ids_row:
        return ids_row.index(eos) + 1
    return sum(t != pad for t in ids_row)


@torch.no_grad()
def policy_stats(model, task: TestbedTask, problems: Sequence, group_size: int = 8,
                 max_new_tokens: int | None = None, seed: int = 0, prompts_per_call: int = 64) -> dict:
    """Sample ``group_size`` completions per problem and summarise them.

    Returns pass rate (overall and by difficulty), the fraction of groups with exactly one
    correct rollout / all wrong / all right, the working rate (overall and by difficulty),
    mean completion length (tokens incl. EOS) with and without working, pass rate with and
    without working by difficulty, truncation rate and generation seconds.
    """
    max_new_tokens = max_new_tokens or task.cfg.max_new_tokens
    tok = task.tokenizer
    rows = []  # (difficulty, group_index, reward, working, length, truncated)
    t_gen = 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for s in range(0, len(problems), prompts_per_call):
            chunk = problems[s: s + prompts_per_call]
            t0 = time.perf_counter()
            texts, ids = generate_completions(model, tok, [p.prompt for p in chunk], group_size,
                                              max_new_tokens=max_new_tokens)
            t_gen += time.perf_counter() - t0
            for j, (text, row) in enumerate(zip(texts, ids.tolist())):
                p = chunk[j // group_size]
                rows.append((p.difficulty, s + j // group_size, task.reward(text, p),
                             task.uses_working(text), _completion_len(row, tok.eos_token_id, tok.pad_token_id),
                             tok.eos_token not in text))
    a = np.array(rows, dtype=float)
    diff, grp, rew, work, length, trunc = a.T
    n_groups = len(problems)
    correct_per_group = np.bincount(grp.astype(int), weights=rew, minlength=n_groups)
    levels = sorted({int(d) for d in diff})

    def _mean(x):
        return float(x.mean()) if x.size else float("nan")

    out = {
        "n_problems": n_groups,
        "group_size": group_size,
        "pass_rate": _mean(rew),
        "pass_rate_by_difficulty": {d: _mean(rew[diff == d]) for d in levels},
        "frac_groups_exactly_one_correct": float(np.mean(correct_per_group == 1)),
        "frac_groups_all_wrong": float(np.mean(correct_per_group == 0)),
        "frac_groups_all_correct": float(np.mean(correct_per_group == group_size)),
        "frac_groups_mixed": float(np.mean((correct_per_group > 0) & (correct_per_group < group_size))),
        "working_rate": _mean(work),
        "working_rate_by_difficulty": {d: _mean(work[diff == d]) for d in levels},
        "mean_len_with_working": _mean(length[work == 1]),
        "mean_len_without_working": _mean(length[work == 0]),
        "pass_rate_with_working_by_difficulty": {d: _mean(rew[(diff == d) & (work == 1)]) for d in levels},
        "pass_rate_without_working_by_difficulty": {d: _mean(rew[(diff == d) & (work == 0)]) for d in levels},
        "truncation_rate": _mean(trunc),
        "generate_seconds": t_gen,
    }
    return out




@torch.no_grad()
def forced_mode_pass_rate(model, task: TestbedTask, problems: Sequence, working: bool,
                          n_samples: int = 4, max_new_tokens: int | None = None, seed: int = 0) -> dict:
    """Sampled pass rate by difficulty when the scratchpad is forced (``working=True``: the
    prompt is extended with ``[``) or forbidden (``working=False``: ``[`` is a bad word).
    Answers the question "does the working help on this item?" for the current policy."""
    max_new_tokens = max_new_tokens or task.cfg.max_new_tokens
    tok = task.tokenizer
    tok.padding_side = "left"
    open_id = tok.convert_tokens_to_ids("[")
    prompts = [p.prompt + ("[" if working else "") for p in problems]
    enc = tok(prompts, return_tensors="pt", padding=True)
    kw = dict(max_new_tokens=max_new_tokens, num_return_sequences=n_samples, do_sample=True,
              temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tok.pad_token_id,
              eos_token_id=tok.eos_token_id)
    if not working:
        kw["bad_words_ids"] = [[open_id]]
    model.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(**enc, **kw)
    comp = out[:, enc["input_ids"].shape[1]:]
    from .model import decode_completions
    texts = decode_completions(tok, comp)
    by: dict[int, list[float]] = {}
    for j, text in enumerate(texts):
        p = problems[j // n_samples]
        by.setdefault(p.difficulty, []).append(task.reward(("[" if working else "") + text, p))
    return {d: float(np.mean(v)) for d, v in sorted(by.items())}


__all__ = ["policy_stats", "forced_mode_pass_rate"]
