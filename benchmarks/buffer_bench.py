"""Time the replay core's per-step bookkeeping: add + evict + sample + compose.

Usage: .venv/bin/python benchmarks/buffer_bench.py [--sizes 1000,10000,100000,1000000] [--repeats 20]

For each stored size N (rollouts with short completions) it times one step's operations, and separately
"sample 512 of N". The "paper default" row is about 5k stored rollouts of ~1k completion tokens each
(256 fresh rows a step, tau_max = 10, 128 replay rows drawn). If torchrl is installed, its
PrioritizedSampler is timed drawing 512 of N too (install: pip install torchrl; optional extra `bench`).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from grpo_replay import ReplayBuffer, ReplayConfig, compose_batch  # noqa: E402
from helpers import make_batch  # noqa: E402


def timeit(fn, repeats):
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3  # ms


def fill(buf, n_rows, rows_per_add, completion, step0=0):
    chunk = make_batch(rows_per_add // 8, 8, step=step0, seed=0, max_prompt=16, max_completion=completion)
    added, t = 0, step0
    while added < n_rows:
        buf.add(chunk, t)
        added += len(chunk)
    return chunk


def bench_size(n, repeats):
    cfg = ReplayConfig(warmup_steps=0, tau_max=None, capacity=None)
    buf = ReplayBuffer(cfg, seed=0)
    fill(buf, n, 1024, completion=16)
    sample_ms = timeit(lambda: buf.sampler.sample(buf.storage, 512, buf.rng), repeats)
    fresh = make_batch(32, 8, step=1, seed=1, max_prompt=16, max_completion=16)

    def step():
        buf.add(fresh, 1)
        buf.evict(1)
        compose_batch(fresh, buf, 1)

    step_ms = timeit(step, repeats)
    bytes_per = buf.storage.nbytes() / len(buf)
    out = {"N": n, "sample512_ms": sample_ms, "step_ms": step_ms, "bytes_per_rollout": bytes_per}
    try:
        from torchrl.data import LazyTensorStorage, ReplayBuffer as TRB
        from torchrl.data.replay_buffers.samplers import PrioritizedSampler as TPS
        from tensordict import TensorDict

        trb = TRB(
            storage=LazyTensorStorage(n),
            sampler=TPS(max_capacity=n, alpha=0.5, beta=0.0),
            batch_size=512,
        )
        trb.extend(TensorDict({"a": torch.zeros(n)}, batch_size=[n]))
        trb.update_priority(torch.arange(n), torch.rand(n) + 1e-6)
        out["torchrl_sample512_ms"] = timeit(lambda: trb.sample(), repeats)
    except (ImportError, RuntimeError) as e:  # not installed, or its C++ segment tree not built for this torch
        out["torchrl_sample512_ms"] = None
        out["torchrl_error"] = f"{type(e).__name__}: {e}"
    return out


def bench_paper_default(repeats):
    """About 5k stored rollouts of ~1k completion tokens: 512 fresh rows a step (64 prompts x 8), tau_max = 10,
    so 11 steps of rows are alive; evictions every step. Each part of a step is timed on its own."""
    from grpo_replay import RolloutBatch

    cfg = ReplayConfig(warmup_steps=0)
    buf = ReplayBuffer(cfg, seed=0)
    fresh = make_batch(64, 8, step=0, seed=1, max_prompt=256, max_completion=2048)  # mean ~1k completion tokens
    for t in range(11):
        buf.add(fresh, t)
    step = [11]
    n_replay = round(cfg.replay_ratio * len(fresh))
    parts = {"evict": [], "sample+gather": [], "concat": [], "add": []}
    for _ in range(repeats):
        s = step[0]
        t0 = time.perf_counter()
        buf.evict(s)
        t1 = time.perf_counter()
        replay = buf.sample(n_replay, s)
        t2 = time.perf_counter()
        RolloutBatch.concat([fresh, replay])
        t3 = time.perf_counter()
        buf.add(fresh, s)
        t4 = time.perf_counter()
        for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[k].append(v * 1e3)
        step[0] += 1
    med = {k: statistics.median(v) for k, v in parts.items()}
    tokens = int(fresh.completion_mask.sum())
    return {"stored": len(buf), "fresh": len(fresh), "replay": n_replay, "fresh_tokens": tokens, "ms": med,
            "bytes_per_rollout": buf.storage.nbytes() / len(buf)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000,1000000")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, numpy {np.__version__}")
    print("| stored N | sample 512 (ms) | torchrl sample 512 (ms) | add+evict+sample+compose, 256 fresh (ms) | bytes/rollout |")
    print("|---|---|---|---|---|")
    sizes = [int(x) for x in a.sizes.split(",")]
    notes: list[str] = []
    for n in sizes:
        r = bench_size(n, a.repeats)
        tr = "n/a" if r["torchrl_sample512_ms"] is None else f"{r['torchrl_sample512_ms']:.2f}"
        if r.get("torchrl_error") and n == sizes[0]:
            notes.append(f"torchrl unavailable: {r['torchrl_error']}")
        print(f"| {n:,} | {r['sample512_ms']:.2f} | {tr} | {r['step_ms']:.2f} | {r['bytes_per_rollout']:.0f} |", flush=True)
    for note in notes:
        print(note)
    p = bench_paper_default(a.repeats)
    ms = p["ms"]
    print(
        f"\npaper default: {p['stored']:,} stored rollouts (~1k completion tokens, {p['bytes_per_rollout']:.0f} bytes each); "
        f"a step of {p['fresh']} fresh rows ({p['fresh_tokens']:,} completion tokens) + {p['replay']} replay rows:\n"
        + "".join(f"  {k}: {v:.2f} ms\n" for k, v in ms.items())
        + f"  buffer bookkeeping (evict + sample+gather + add): {ms['evict'] + ms['sample+gather'] + ms['add']:.2f} ms; "
        f"with the padded concat: {sum(ms.values()):.2f} ms"
    )


if __name__ == "__main__":
    main()
