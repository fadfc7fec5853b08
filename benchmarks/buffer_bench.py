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
    chunk = fill(buf, n, 1024, completion=16)
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
    """~5k stored rollouts of ~1k tokens: 256 fresh rows/step, tau_max=10, evictions each step."""
    cfg = ReplayConfig(warmup_steps=0)
    buf = ReplayBuffer(cfg, seed=0)
    fresh = make_batch(32, 8, step=0, seed=1, max_prompt=256, max_completion=2048)  # mean ~1k tokens
    for t in range(20):
        fresh.birth_step[:] = t
        buf.add(fresh, t)
        buf.evict(t + 1)
    t = [20]

    def step():
        s = t[0]
        buf.evict(s)
        compose_batch(fresh, buf, s)
        buf.add(fresh, s)
        t[0] += 1

    ms = timeit(step, repeats)
    return {"stored": len(buf), "step_ms": ms, "bytes_per_rollout": buf.storage.nbytes() / len(buf)}


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
    print(
        f"\npaper default: {p['stored']:,} stored rollouts (~1k completion tokens), evict+sample+compose+add "
        f"of 256 fresh + 128 replay: {p['step_ms']:.2f} ms/step, {p['bytes_per_rollout']:.0f} bytes/rollout"
    )


if __name__ == "__main__":
    main()
