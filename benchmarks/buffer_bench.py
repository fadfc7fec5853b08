"""Time the replay core's per-step bookkeeping, and its prioritized sampling next to TorchRL's and cpprb's.

Usage:
  .venv/bin/python benchmarks/buffer_bench.py [--sizes 1000,10000,100000,1000000] [--repeats 20]
      [--peers-python PYTHON]

Every number is the median of --repeats timings (wall clock, time.perf_counter); the paper-default parts also
give process CPU time (all threads), which other load on the machine inflates less.

1. Paper default: 11 steps x 512 fresh rows (64 prompts x 8) of ~1k completion tokens stored (tau_max = 10),
   then each step: evict, sample 256 replay rows, gather them into a padded batch, concatenate with the fresh
   rows (the padded concatenation), add the 512 fresh rows. Targets: evict + sample + gather + add < 5 ms,
   concatenation < 3 ms.
2. Sizes: N stored rollouts with short completions; "sample 512 of N" (our default: without replacement)
   and a whole step (add 256 + evict + sample + compose).
3. Peers (--peers-python: an interpreter with torchrl and cpprb, e.g. the one `bench` extra environment
   described in the README): in that one process, at N in {10k, 100k, 1M}, "sample 512" by TorchRL's
   PrioritizedSampler (through its ReplayBuffer, LazyTensorStorage of one float per item), cpprb's
   PrioritizedReplayBuffer (one float per item) and ours, with and without replacement (the peers draw
   with replacement). Priorities are random, alpha = 0.5, beta = 0 where a peer asks for it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from grpo_replay import ReplayBuffer, ReplayConfig, RolloutBatch, compose_batch, group_advantages  # noqa: E402

PEER_SIZES = (10_000, 100_000, 1_000_000)


def timeit(fn, repeats):
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3  # ms


def make_batch(n_groups, group_size, step, seed, max_prompt, max_completion):
    """Random fresh batch: uniform prompt/completion lengths, binary rewards (as tests/helpers.make_batch)."""
    g = torch.Generator().manual_seed(seed)
    B = n_groups * group_size
    group_ids = torch.arange(B) // group_size
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    adv, std = group_advantages(rewards, group_ids)
    plen = torch.randint(1, max_prompt + 1, (B,), generator=g)
    clen = torch.randint(1, max_completion + 1, (B,), generator=g)
    P, C = int(plen.max()), int(clen.max())
    pmask = (torch.arange(P)[None] >= P - plen[:, None]).long()
    cmask = (torch.arange(C)[None] < clen[:, None]).long()
    return RolloutBatch.fresh(
        prompt_ids=torch.randint(1, 50_000, (B, P), generator=g) * pmask,
        prompt_mask=pmask,
        completion_ids=torch.randint(1, 50_000, (B, C), generator=g) * cmask,
        completion_mask=cmask,
        behaviour_logps=-torch.rand(B, C, generator=g) * cmask,
        advantages=adv,
        rewards=rewards,
        group_ids=group_ids,
        group_std=std,
        step=step,
    )


def fill(buf, n_rows, rows_per_add, completion):
    chunk = make_batch(rows_per_add // 8, 8, 0, 0, 16, completion)
    while len(buf) < n_rows:
        buf.add(chunk, 0)


def bench_size(n, repeats):
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None, capacity=None), seed=0)
    fill(buf, n, 1024, completion=16)
    sample_ms = timeit(lambda: buf.sampler.sample(buf.storage, 512, buf.rng), repeats)
    fresh = make_batch(32, 8, 1, 1, 16, 16)

    def step():
        buf.add(fresh, 1)
        buf.evict(1)
        compose_batch(fresh, buf, 1)

    step_ms = timeit(step, repeats)
    return {"N": n, "sample512_ms": sample_ms, "step_ms": step_ms, "bytes_per_rollout": buf.storage.nbytes() / len(buf)}


def bench_paper_default(repeats):
    cfg = ReplayConfig(warmup_steps=0)
    buf = ReplayBuffer(cfg, seed=0)
    fresh = make_batch(64, 8, 0, 1, 256, 2048)  # completion lengths uniform in 1..2048: mean ~1k tokens
    for t in range(11):
        buf.add(fresh, t)
    n_replay = round(cfg.replay_ratio * len(fresh))
    names = ("evict", "sample", "gather", "concat", "add")
    parts = {k: [] for k in names}
    cpu = {k: [] for k in names}  # process CPU time (all threads): less sensitive to other load than wall time
    for s in range(11, 11 + repeats):
        steps = (lambda: buf.evict(s), lambda: buf.sampler.sample(buf.storage, n_replay, buf.rng), None, None,
                 lambda: buf.add(fresh, s))
        out = None
        for k, fn in zip(names, steps):
            t0, c0 = time.perf_counter(), time.process_time()
            if k == "gather":
                replay = buf.gather(out)
            elif k == "concat":
                composed = RolloutBatch.concat([fresh, replay])
            else:
                out = fn()
            parts[k].append((time.perf_counter() - t0) * 1e3)
            cpu[k].append((time.process_time() - c0) * 1e3)
    med = {k: statistics.median(v) for k, v in parts.items()}
    # The floor under any concat: copying its output's bytes once into tensors allocated beforehand.
    fields = [t for t in vars(composed).values() if isinstance(t, torch.Tensor)]
    dst = [torch.empty_like(t) for t in fields]
    floor = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for d, t in zip(dst, fields):
            d.copy_(t)
        floor.append((time.perf_counter() - t0) * 1e3)
    book = [sum(parts[k][i] for k in ("evict", "sample", "gather", "add")) for i in range(repeats)]
    book_cpu = [sum(cpu[k][i] for k in ("evict", "sample", "gather", "add")) for i in range(repeats)]
    return {"stored": len(buf), "fresh": len(fresh), "replay": n_replay, "fresh_tokens": int(fresh.completion_mask.sum()),
            "ms": med, "cpu_ms": {k: statistics.median(v) for k, v in cpu.items()},
            "bookkeeping_ms": statistics.median(book), "bookkeeping_cpu_ms": statistics.median(book_cpu),
            "bytes_per_rollout": buf.storage.nbytes() / len(buf),
            "concat_bytes": sum(t.numel() * t.element_size() for t in fields), "copy_floor_ms": statistics.median(floor)}


def bench_peers(repeats, sizes=PEER_SIZES):
    """Runs inside the peers' interpreter; returns {N: {name: ms or error string}}."""
    out = {}
    for n in sizes:
        rng = np.random.default_rng(0)
        prio = rng.random(n) + 1e-6
        row = {}
        for replacement in (False, True):
            buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None, capacity=None, replacement=replacement), seed=0)
            fill(buf, n, 8192, completion=4)
            row["ours" + ("_repl" if replacement else "")] = timeit(lambda: buf.sampler.sample(buf.storage, 512, buf.rng), repeats)
        try:
            from tensordict import TensorDict
            from torchrl.data import LazyTensorStorage
            from torchrl.data import ReplayBuffer as TRB
            from torchrl.data.replay_buffers.samplers import PrioritizedSampler

            trb = TRB(storage=LazyTensorStorage(n), sampler=PrioritizedSampler(max_capacity=n, alpha=0.5, beta=0.0), batch_size=512)
            trb.extend(TensorDict({"a": torch.zeros(n)}, batch_size=[n]))
            trb.update_priority(torch.arange(n), torch.from_numpy(prio).float())
            row["torchrl"] = timeit(lambda: trb.sample(), repeats)
        except Exception as e:  # not installed, or its C++ segment tree not built for this torch
            row["torchrl"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        try:
            import cpprb

            crb = cpprb.PrioritizedReplayBuffer(n, {"a": {"shape": 1}}, alpha=0.5)
            crb.add(a=np.zeros((n, 1)), priorities=prio)
            row["cpprb"] = timeit(lambda: crb.sample(512, beta=0.0), repeats)
        except Exception as e:
            row["cpprb"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        out[n] = row
    return out


def machine():
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.machine()}, {os.cpu_count()} cores, load average {load:.1f}; python {platform.python_version()}, "
            f"numpy {np.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000,1000000")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--peers-python", default=None, help="interpreter with torchrl and cpprb installed")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)")
    ap.add_argument("--peers-only", action="store_true", help=argparse.SUPPRESS)  # the child process
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.peers_only:
        print(json.dumps({"machine": machine(), "rows": bench_peers(a.repeats)}))
        return
    from grpo_replay.provenance import git_commit

    print(f"{machine()}; commit {git_commit()}")
    p = bench_paper_default(a.repeats)
    ms = p["ms"]
    print(
        f"\npaper default: {p['stored']:,} stored rollouts (~1k completion tokens, {p['bytes_per_rollout']:.0f} bytes each "
        f"in the padded arena); a step of {p['fresh']} fresh rows ({p['fresh_tokens']:,} completion tokens) + "
        f"{p['replay']} replay rows, median of {a.repeats}:\n"
        + "".join(f"  {k}: {v:.2f} ms (CPU time {p['cpu_ms'][k]:.2f} ms)\n" for k, v in ms.items())
        + f"  bookkeeping (evict + sample + gather + add): {p['bookkeeping_ms']:.2f} ms, CPU time "
        f"{p['bookkeeping_cpu_ms']:.2f} ms (target < 5: "
        f"{'met' if p['bookkeeping_ms'] < 5 else 'missed'}); padded concat: {ms['concat']:.2f} ms (target < 3: "
        f"{'met' if ms['concat'] < 3 else 'missed'})\n"
        f"  copy floor: the concat's output ({p['concat_bytes'] / 1e6:.1f} MB) copied once into preallocated tensors: "
        f"{p['copy_floor_ms']:.2f} ms"
    )
    print("\n| stored N | sample 512 (ms) | add+evict+sample+compose, 256 fresh (ms) | bytes/rollout |")
    print("|---|---|---|---|")
    for n in [int(x) for x in a.sizes.split(",")]:
        r = bench_size(n, a.repeats)
        print(f"| {n:,} | {r['sample512_ms']:.2f} | {r['step_ms']:.2f} | {r['bytes_per_rollout']:.0f} |", flush=True)
    if a.peers_python:
        threads = ["--threads", str(a.threads)] if a.threads else []
        res = subprocess.run([a.peers_python, __file__, "--peers-only", "--repeats", str(a.repeats), *threads],
                             capture_output=True, text=True, check=False)
        if res.returncode != 0:
            print(f"\npeers: {a.peers_python} failed:\n{res.stderr[-2000:]}")
            return
        peers = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"\npeers, sample 512 of N (ms), in one process: {peers['machine']}")
        print("| stored N | ours, without replacement | ours, with replacement | TorchRL PrioritizedSampler | cpprb PrioritizedReplayBuffer | TorchRL / ours (with repl.) | cpprb / ours (with repl.) |")
        print("|---|---|---|---|---|---|---|")
        errors = set()
        for n, row in peers["rows"].items():
            cells = []
            for k in ("torchrl", "cpprb"):
                if isinstance(row[k], str):
                    errors.add(f"{k}: {row[k]}")
            fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else "n/a"  # noqa: E731
            ratio = lambda k: f"{row[k] / row['ours_repl']:.1f}x" if isinstance(row[k], float) else "n/a"  # noqa: E731
            cells = [fmt(row["ours"]), fmt(row["ours_repl"]), fmt(row["torchrl"]), fmt(row["cpprb"]), ratio("torchrl"), ratio("cpprb")]
            print(f"| {int(n):,} | " + " | ".join(cells) + " |")
        for e in sorted(errors):
            print(f"unavailable: {e}")


if __name__ == "__main__":
    main()
