"""The `ReplaySession`'s bookkeeping per step at the paper's shapes, on the CPU, with the model's work stubbed out.

A step: 512 prompts x 8 rollouts of 1,024 prompt and 4,096 completion tokens (every row at full length: the most
bytes a step of that recipe moves), the paper's defaults (tau_max 10, replay_ratio 0.5 -> 2,048 replay rows,
capacity 30,000). Timed per step, after the buffer reached its capacity: `compose` (evict, draw, gather, compose),
`defer` + `flush` (the add), `tally` + `buffer_metrics`. The fresh batch (random ids, random log-probs standing in
for the update's forward) is built outside the timed part.

    PYTHONPATH=src .venv/bin/python benchmarks/session_bench.py [--prompts 512] [--steps 12] [--timed 4]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpo_replay import ReplayConfig, ReplaySession, RolloutBatch, group_advantages


def fresh_batch(n_prompts: int, group: int, P: int, C: int, step: int, g: torch.Generator) -> RolloutBatch:
    n = n_prompts * group
    rewards = (torch.rand(n, generator=g) < 0.4).float()
    group_ids = torch.arange(n) // group
    adv, std = group_advantages(rewards, group_ids)
    return RolloutBatch.fresh(
        prompt_ids=torch.randint(1, 150_000, (n, P), generator=g, dtype=torch.int32),
        prompt_mask=torch.ones(n, P, dtype=torch.bool),
        completion_ids=torch.randint(1, 150_000, (n, C), generator=g, dtype=torch.int32),
        completion_mask=torch.ones(n, C, dtype=torch.bool),
        behaviour_logps=-torch.rand(n, C, generator=g),
        advantages=adv, rewards=rewards, group_ids=group_ids, group_std=std, step=step,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--completion-len", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--timed", type=int, default=4, help="the last this many steps are reported")
    a = ap.parse_args()
    torch.set_num_threads(1)
    session = ReplaySession(ReplayConfig.paper(warmup_steps=0), seed=0)
    g = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {"compose": [], "add": [], "metrics": [], "total": []}
    for t in range(a.steps):
        fresh = fresh_batch(a.prompts, a.group, a.prompt_len, a.completion_len, t, g)
        t0 = time.perf_counter()
        batch = session.compose(fresh, t).batch
        _ = batch.completion_ids, batch.behaviour_logps  # the update reads them: the concatenation is paid here
        t1 = time.perf_counter()
        session.defer(fresh)
        session.flush(before=t + 1)
        t2 = time.perf_counter()
        session.tally(batch, t, groups=a.prompts, zero_variance_groups=0).metrics()
        session.buffer_metrics(t + 1)
        t3 = time.perf_counter()
        if t >= a.steps - a.timed:
            for k, v in (("compose", t1 - t0), ("add", t2 - t1), ("metrics", t3 - t2), ("total", t3 - t0)):
                times[k].append(v)
        print(f"step {t}: {len(batch)} update rows ({int(batch.is_replay.sum())} replayed), buffer {len(session.buffer)}"
              f" rows, {session.buffer.storage.nbytes() / 2**30:.2f} GiB; {t3 - t0:.2f} s", flush=True)
    print("median / min over the last", a.timed, "steps, seconds:")
    for k, v in times.items():
        print(f"  {k:8s} {statistics.median(v):.3f} / {min(v):.3f}")


if __name__ == "__main__":
    main()
