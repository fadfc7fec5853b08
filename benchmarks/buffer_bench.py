"""Time the replay core's per-step bookkeeping, and its prioritized sampling next to TorchRL's and cpprb's.

Usage:
  .venv/bin/python benchmarks/buffer_bench.py [--sizes 1000,10000,100000,1000000] [--repeats 20]
      [--peers-python PYTHON]

Every number is the median of --repeats timings (wall clock, time.perf_counter); the paper-default parts also
give process CPU time (all threads), which other load on the machine inflates less.

1. Paper default: 11 steps x 512 fresh rows (64 prompts x 8) of ~1k completion tokens stored (tau_max = 10),
   then each step: evict, sample 256 replay rows, gather them into a padded batch, compose them with the
   fresh rows, add the 512 fresh rows. Targets: evict + sample + gather + add < 5 ms, composition < 3 ms.
   The fresh rows are in the narrow form the built-in trainer's generation produces (int32 ids, bool masks;
   it casts on the model's device before the copy to the host), and gather hands out the same form.
   "compose" is what `compose_batch` does after the draw (`fresh_anchored`: a `ComposedBatch` of the fresh
   and replay segments, no padded concatenation) plus cutting it into the micro-batches the trainer feeds the
   loss (views of one segment each). The work this moves or leaves elsewhere is timed on its own lines: the
   padded concatenation, paid once by a consumer that reads a whole-batch token field (`ComposedBatch.dense`),
   and the floor under it (its bytes copied into preallocated tensors); add and the padded concatenation
   with int64 fresh rows (as TRL and verl hand them over: add narrows them, with the id range check), and
   narrowing int64 rows on the CPU. The trainer's update without micro_batch_size now runs two forward
   passes (the fresh rows, the replay rows), each padded to its own width; that cost is on the model's
   device and not timed here.
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
from grpo_replay.composition import fresh_anchored  # noqa: E402

PEER_SIZES = (10_000, 100_000, 1_000_000)


def timeit(fn, repeats):
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3  # ms


def make_batch(n_groups, group_size, step, seed, max_prompt, max_completion, narrow=True):
    """Random fresh batch: uniform prompt/completion lengths, binary rewards (as tests/helpers.make_batch).
    `narrow`: int32 ids and bool masks, as the built-in trainer's generation hands them over (cast on the
    model's device before the copy to the host); else int64 ids and masks, as TRL and verl do."""
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
    ids, m = (torch.int32, torch.bool) if narrow else (torch.int64, torch.int64)
    pmask = pmask.to(m)
    cmask_t = cmask.to(m)
    return RolloutBatch.fresh(
        prompt_ids=(torch.randint(1, 50_000, (B, P), generator=g) * pmask).to(ids),
        prompt_mask=pmask,
        completion_ids=(torch.randint(1, 50_000, (B, C), generator=g) * cmask).to(ids),
        completion_mask=cmask_t,
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


def _median_ms(fn, repeats):
    """(median wall ms, median CPU ms) of fn()."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def bench_paper_default(repeats):
    cfg = ReplayConfig(warmup_steps=0)
    buf = ReplayBuffer(cfg, seed=0)
    fresh = make_batch(64, 8, 0, 1, 256, 2048)  # completion lengths uniform in 1..2048: mean ~1k tokens
    for t in range(11):
        buf.add(fresh, t)
    n_replay = round(cfg.replay_ratio * len(fresh))
    names = ("evict", "sample", "gather", "compose", "add")
    parts = {k: [] for k in names}
    cpu = {k: [] for k in names}  # process CPU time (all threads): less sensitive to other load than wall time
    for s in range(11, 11 + repeats):
        out = replay = None
        for k in names:
            t0, c0 = time.perf_counter(), time.process_time()
            if k == "evict":
                buf.evict(s)
            elif k == "sample":
                out = buf.sampler.sample(buf.storage, n_replay, buf.rng)
            elif k == "gather":
                replay = buf.gather(out)
            elif k == "compose":  # the composition compose_batch runs, and the micro-batches the trainer cuts
                composed, _ = fresh_anchored(fresh, lambda n: replay, cfg.replay_ratio, buf.rng)
                micro = list(composed.micro_batches(None))
            else:
                buf.add(fresh, s)
            parts[k].append((time.perf_counter() - t0) * 1e3)
            cpu[k].append((time.process_time() - c0) * 1e3)
    assert sum(len(m) for m in micro) == len(fresh) + n_replay
    stored, nbytes = len(buf), buf.storage.nbytes()
    med = {k: statistics.median(v) for k, v in parts.items()}
    # The padded concatenation the composition no longer makes: what reading a whole-batch token field of the
    # composed batch costs (ComposedBatch.dense), and the floor under it: its bytes copied once into
    # tensors allocated beforehand.
    dense = RolloutBatch.concat([fresh, replay])
    concat_ms = _median_ms(lambda: RolloutBatch.concat([fresh, replay]), repeats)
    fields = [t for t in vars(dense).values() if isinstance(t, torch.Tensor)]
    dst = [torch.empty_like(t) for t in fields]
    floor_ms = _median_ms(lambda: [d.copy_(t) for d, t in zip(dst, fields)], repeats)
    # What TRL and verl hand over: int64 ids and masks. add narrows them (and checks the id range); a
    # concatenation with them is int64 (the wider dtype). And the cast the built-in trainer's generation
    # makes on the model's device, here on the CPU.
    wide = make_batch(64, 8, 0, 1, 256, 2048, narrow=False)
    steps = iter(range(11 + repeats, 11 + 2 * repeats))
    wide_add = _median_ms(lambda: (buf.evict(s := next(steps)), buf.add(wide, s)), repeats)  # includes the evict
    wide_concat = _median_ms(lambda: RolloutBatch.concat([wide, replay]), repeats)
    narrow_ms = _median_ms(lambda: (wide.prompt_ids.int(), wide.prompt_mask.bool(), wide.completion_ids.int(),
                                    wide.completion_mask.bool()), repeats)
    book = [sum(parts[k][i] for k in ("evict", "sample", "gather", "add")) for i in range(repeats)]
    book_cpu = [sum(cpu[k][i] for k in ("evict", "sample", "gather", "add")) for i in range(repeats)]
    return {"stored": stored, "fresh": len(fresh), "replay": n_replay, "fresh_tokens": int(fresh.completion_mask.sum()),
            "ms": med, "cpu_ms": {k: statistics.median(v) for k, v in cpu.items()},
            "bookkeeping_ms": statistics.median(book), "bookkeeping_cpu_ms": statistics.median(book_cpu),
            "bytes_per_rollout": nbytes / stored,
            "concat_bytes": sum(t.numel() * t.element_size() for t in fields), "concat_ms": concat_ms,
            "copy_floor_ms": floor_ms, "wide_add_ms": wide_add, "wide_concat_ms": wide_concat,
            "wide_concat_bytes": sum(t.numel() * t.element_size() for t in vars(RolloutBatch.concat([wide, replay])).values()
                                     if isinstance(t, torch.Tensor)),
            "narrow_ms": narrow_ms}


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
    from grpo_replay.app.provenance import git_commit

    print(f"{machine()}; commit {git_commit()}")
    p = bench_paper_default(a.repeats)
    ms = p["ms"]
    both = lambda t: f"{t[0]:.2f} ms (CPU time {t[1]:.2f} ms)"  # noqa: E731
    print(
        f"\npaper default: {p['stored']:,} stored rollouts (~1k completion tokens, {p['bytes_per_rollout']:.0f} bytes each "
        f"in the padded arena); a step of {p['fresh']} fresh rows ({p['fresh_tokens']:,} completion tokens; int32 ids, "
        f"bool masks) + {p['replay']} replay rows, median of {a.repeats}:\n"
        + "".join(f"  {k}: {v:.2f} ms (CPU time {p['cpu_ms'][k]:.2f} ms)\n" for k, v in ms.items())
        + f"  bookkeeping (evict + sample + gather + add): {p['bookkeeping_ms']:.2f} ms, CPU time "
        f"{p['bookkeeping_cpu_ms']:.2f} ms (target < 5: {'met' if p['bookkeeping_ms'] < 5 else 'missed'}); "
        f"compose (no padded concatenation: fresh + replay segments): {ms['compose']:.2f} ms (target < 3: "
        f"{'met' if ms['compose'] < 3 else 'missed'})\n"
        f"  the padded concatenation, if a whole-batch token field is read (ComposedBatch.dense, once): "
        f"{both(p['concat_ms'])}; its output ({p['concat_bytes'] / 1e6:.1f} MB) copied once into preallocated "
        f"tensors: {both(p['copy_floor_ms'])}\n"
        f"  int64 fresh rows (as TRL and verl hand them over): evict + add {both(p['wide_add_ms'])}; padded concatenation "
        f"({p['wide_concat_bytes'] / 1e6:.1f} MB) {both(p['wide_concat_ms'])}; narrowing them (int32 ids, bool masks) "
        f"on the CPU {both(p['narrow_ms'])}"
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
