"""Time the replay core at equal work with cpprb and TorchRL, and its paper-default bookkeeping against a copy floor.

Usage:
  .venv/bin/python benchmarks/buffer_bench.py [--sizes 10000,100000,1000000] [--rounds 6] [--steps 8]
      [--rss-sizes 1000000] [--skip-paper]

1. Peers at equal work (the headline). Every library holds the same payload per row: prompt and completion ids
   16 x int32, completion mask 16 x bool, behaviour log-probs 16 x float32, advantage and reward float32, group
   id and birth step int64 (232 bytes; completion lengths uniform in 1..16, masks a prefix). Each is filled to
   N rows (N rounded to a multiple of 256) and then does, per step: add 256 rows with their priorities
   (|A| + eps)^alpha, computed from the advantages inside the timed add as ours computes its weights there
   (TorchRL is given |A| + eps and raises it to alpha itself), drop the 256 oldest, draw 512 rows with their
   data. Ours drops them by age (tau_max = N / 256 - 1 steps, so every step evicts exactly 256 rows;
   checked); cpprb and TorchRL are rings of N rows, so their add overwrites the oldest. Ours draws without
   replacement (its default) and with; cpprb's PrioritizedReplayBuffer and TorchRL's PrioritizedSampler draw
   with replacement only, and also compute importance weights (beta = 0.4), which ours does not need. All
   libraries live in this one process and run interleaved: in each round each library (in a rotated order)
   runs --steps steps; every op is timed with wall clock (time.perf_counter) and this thread's CPU time
   (time.thread_time), min and median over all steps.
   TorchRL is measured when it imports (torchrl 0.14.1's C++ sum tree needs torch >= 2.14.1; see
   docs/benchmarks.md for the environment) and is reported unavailable otherwise.
2. Memory: for each --rss-sizes N, one child process per library builds the buffer, runs 20 steps and reports
   its resident set growth per row (from /proc/self/statm), and ours its own `buffer/bytes`.
3. Paper default: 11 steps x 512 fresh rows (64 prompts x 8, completions uniform in 1..2048 tokens) stored
   (tau_max = 10), then each step: evict, sample 256 replay rows, gather them, add the 512 fresh rows
   ("bookkeeping"), and compose. The copy floor, measured in the same run: the bytes that bookkeeping must move
   (the fresh rows' fields into arena rows of the arena's width, the replay batch's fields out), copied with
   np.copyto between arrays allocated beforehand, plus one read of the fresh completion mask. The caches are
   flushed before each step and each floor copy (both read from memory, as in a trainer). The target:
   bookkeeping within 1.2x of that floor. Beside it (padded storage), a random-row floor: the same, but the
   replay token rows read from the drawn slots' arena rows (`random_row_copies`). Run for the padded storage
   (the default) and for `RolloutStorage(unpadded=True)`, whose floor moves the completions' real positions only.
"""
from __future__ import annotations

import argparse
import gc
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
from grpo_replay import ReplayBuffer, ReplayConfig, RolloutBatch, group_advantages  # noqa: E402
from grpo_replay.composition import fresh_anchored  # noqa: E402
from grpo_replay.padded import PaddedArena  # noqa: E402
from grpo_replay.storage import RolloutStorage  # noqa: E402

TOKENS = 16  # prompt and completion positions per row in the peers' payload
PER_STEP = 256  # rows added (and evicted) per step
DRAW = 512  # rows drawn per step, with their data
ALPHA, EPS, BETA = 0.5, 1e-6, 0.4
N_BATCHES = 4  # distinct fresh batches, cycled


def payload(n: int, seed: int) -> dict[str, np.ndarray]:
    """One batch of the equal-work payload as numpy arrays (the peers' input; ours gets the same as a RolloutBatch)."""
    rng = np.random.default_rng(seed)
    clen = rng.integers(1, TOKENS + 1, n)
    mask = np.arange(TOKENS)[None] < clen[:, None]
    return {
        "prompt_ids": rng.integers(1, 50_000, (n, TOKENS), dtype=np.int32),
        "comp_ids": (rng.integers(1, 50_000, (n, TOKENS), dtype=np.int32) * mask).astype(np.int32),
        "mask": mask,
        "logps": (-rng.random((n, TOKENS), dtype=np.float32) * mask).astype(np.float32),
        "adv": rng.standard_normal(n).astype(np.float32),
        "reward": rng.random(n).astype(np.float32),
        "group": np.arange(n, dtype=np.int64) // 8,
    }


def priorities(p: dict[str, np.ndarray]) -> np.ndarray:
    return np.power(np.abs(p["adv"].astype(np.float64)) + EPS, ALPHA)


class Ours:
    """ReplayBuffer with age eviction holding N rows between steps."""

    def __init__(self, n: int, replacement: bool, unpadded: bool = False):
        self.name = "ours, with repl." if replacement else "ours, unpadded" if unpadded else "ours"
        self.window = n // PER_STEP
        cfg = ReplayConfig(warmup_steps=0, tau_max=self.window - 1, capacity=None, alpha=ALPHA, eps=EPS,
                           replacement=replacement)
        self.buf = ReplayBuffer(cfg, seed=0, storage=RolloutStorage(unpadded=unpadded))
        self.batches = [self._batch(payload(PER_STEP, i)) for i in range(N_BATCHES)]
        for s in range(self.window):
            self.buf.add(self.batches[s % N_BATCHES], s)
        self.step, self.n = self.window, n
        self.evicted: list[int] = []

    @staticmethod
    def _batch(p: dict[str, np.ndarray]) -> RolloutBatch:
        n = len(p["adv"])
        return RolloutBatch.fresh(
            prompt_ids=torch.from_numpy(p["prompt_ids"]), prompt_mask=torch.ones(n, TOKENS, dtype=torch.bool),
            completion_ids=torch.from_numpy(p["comp_ids"]), completion_mask=torch.from_numpy(p["mask"]),
            behaviour_logps=torch.from_numpy(p["logps"]), advantages=torch.from_numpy(p["adv"]),
            rewards=torch.from_numpy(p["reward"]), group_ids=torch.from_numpy(p["group"]),
            group_std=torch.ones(n), step=0)

    def ops(self):
        s, buf = self.step, self.buf
        batch = self.batches[s % N_BATCHES]
        return [("evict", lambda: self.evicted.append(buf.evict(s))), ("sample", lambda: buf.sample(DRAW, s)),
                ("add", lambda: buf.add(batch, s))]

    def advance(self) -> None:
        assert len(self.buf) == self.n and self.evicted[-1] == PER_STEP, (len(self.buf), self.evicted[-1])
        self.step += 1


class Cpprb:
    """cpprb.PrioritizedReplayBuffer: a ring of N rows (add overwrites the oldest), C++ segment trees."""

    def __init__(self, n: int):
        import cpprb

        self.name = "cpprb"
        vec = lambda dt: {"shape": TOKENS, "dtype": dt}  # noqa: E731
        env = {"prompt_ids": vec(np.int32), "comp_ids": vec(np.int32), "mask": vec(np.bool_),
               "logps": vec(np.float32), "adv": {"dtype": np.float32}, "reward": {"dtype": np.float32},
               "group": {"dtype": np.int64}, "birth": {"dtype": np.int64}}
        self.rb = cpprb.PrioritizedReplayBuffer(n, env, alpha=ALPHA, eps=EPS)
        self.batches = [payload(PER_STEP, i) for i in range(N_BATCHES)]
        for s in range(n // PER_STEP):
            self._add(s)
        self.step = n // PER_STEP

    def _add(self, s: int) -> None:
        b = self.batches[s % N_BATCHES]
        # the priorities from the advantages, inside the timed add: ours computes its weights there too
        self.rb.add(**b, birth=np.full(PER_STEP, s, np.int64), priorities=priorities(b))

    def ops(self):
        s = self.step
        return [("add", lambda: self._add(s)), ("sample", lambda: self.rb.sample(DRAW, beta=BETA))]

    def advance(self) -> None:
        self.step += 1


class TorchRL:
    """torchrl ReplayBuffer + LazyTensorStorage (a ring of N rows) + PrioritizedSampler (C++ sum tree)."""

    def __init__(self, n: int):
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers import PrioritizedSampler

        self.name = "TorchRL"
        self.rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n),
                                         sampler=PrioritizedSampler(max_capacity=n, alpha=ALPHA, beta=BETA, eps=EPS),
                                         batch_size=DRAW)
        self.batches = [TensorDict({k: torch.from_numpy(v) for k, v in payload(PER_STEP, i).items()}, batch_size=[PER_STEP])
                        for i in range(N_BATCHES)]
        for s in range(n // PER_STEP):
            self._add(s)
        self.step = n // PER_STEP

    def _add(self, s: int) -> None:
        b = self.batches[s % N_BATCHES]
        b["birth"] = torch.full((PER_STEP,), s, dtype=torch.int64)
        idx = self.rb.extend(b)
        # TorchRL raises a priority to alpha itself: pass the signal |A| + eps, computed here as ours is. Its sum
        # tree is float32 (the float64 option fails inside extend in 0.14.1: the default priority it writes is float32)
        self.rb.update_priority(idx, b["adv"].abs() + EPS)

    def ops(self):
        s = self.step
        return [("add", lambda: self._add(s)), ("sample", lambda: self.rb.sample())]

    def advance(self) -> None:
        self.step += 1


def peer_factories() -> tuple[dict, dict[str, str]]:
    """name -> constructor(n) of every library that imports here; name -> why not, for the others."""
    made = {"ours": lambda n: Ours(n, False), "ours, with repl.": lambda n: Ours(n, True),
            "ours, unpadded": lambda n: Ours(n, False, unpadded=True)}
    missing = {}
    try:
        import cpprb  # noqa: F401

        made["cpprb"] = Cpprb
    except ImportError as e:
        missing["cpprb"] = f"{type(e).__name__}: {e}"
    try:
        from torchrl.data.replay_buffers.samplers import PrioritizedSampler

        PrioritizedSampler(max_capacity=8, alpha=ALPHA, beta=BETA)  # its C++ sum tree loads only with its torch
        made["TorchRL"] = TorchRL
    except Exception as e:  # not installed, or its C++ extension not loadable with this torch
        missing["TorchRL"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return made, missing


def interleaved(libs: list, rounds: int, steps: int) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """lib name -> op name (and "step") -> [(wall ms, thread CPU ms)] per step."""
    out = {lib.name: {} for lib in libs}
    for r in range(rounds):
        gc.collect()
        for lib in libs[r % len(libs):] + libs[: r % len(libs)]:
            for _ in range(steps):
                tot_w = tot_c = 0.0
                for name, fn in lib.ops():
                    w0, c0 = time.perf_counter(), time.thread_time()
                    fn()
                    w, c = (time.perf_counter() - w0) * 1e3, (time.thread_time() - c0) * 1e3
                    out[lib.name].setdefault(name, []).append((w, c))
                    tot_w, tot_c = tot_w + w, tot_c + c
                out[lib.name].setdefault("step", []).append((tot_w, tot_c))
                lib.advance()
    return out


def summary(ts: list[tuple[float, float]]) -> dict[str, float]:
    w, c = [t[0] for t in ts], [t[1] for t in ts]
    return {"wall_min": min(w), "wall_med": statistics.median(w), "cpu_min": min(c), "cpu_med": statistics.median(c)}


def bench_peers(sizes: list[int], rounds: int, steps: int) -> dict:
    made, missing = peer_factories()
    res = {}
    for n_target in sizes:
        n = max(2, round(n_target / PER_STEP)) * PER_STEP
        libs = []
        for name, make in list(made.items()):
            try:
                libs.append(make(n))
            except Exception as e:  # e.g. a peer whose native part fails only once used: report it, go on
                missing[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                del made[name]
        times = interleaved(libs, rounds, steps)
        res[n] = {name: {op: summary(ts) for op, ts in ops.items()} for name, ops in times.items()}
        del libs
        gc.collect()
    return {"rows": res, "missing": missing}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_child(name: str, n: int) -> dict:
    made, _ = peer_factories()
    base = rss_bytes()
    lib = made[name](n)
    for _ in range(20):
        for _, fn in lib.ops():
            fn()
        lib.advance()
    gc.collect()
    out = {"rss_per_row": (rss_bytes() - base) / n}
    if isinstance(lib, Ours):
        out["nbytes_per_row"] = lib.buf.storage.nbytes() / len(lib.buf)
    return out


def bench_rss(sizes: list[int]) -> dict:
    made, _ = peer_factories()
    res = {}
    for n_target in sizes:
        n = round(n_target / PER_STEP) * PER_STEP
        for name in made:
            if name == "ours, with repl.":
                continue
            p = subprocess.run([sys.executable, __file__, "--rss-child", name, str(n)], capture_output=True, text=True)
            res.setdefault(n, {})[name] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else p.stderr[-300:]
    return res


def make_batch(n_groups, group_size, seed, max_prompt, max_completion):
    """Random fresh batch (int32 ids, bool masks, as the built-in trainer hands them over): uniform prompt and
    completion lengths, binary rewards."""
    g = torch.Generator().manual_seed(seed)
    B = n_groups * group_size
    group_ids = torch.arange(B) // group_size
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    adv, std = group_advantages(rewards, group_ids)
    plen = torch.randint(1, max_prompt + 1, (B,), generator=g)
    clen = torch.randint(1, max_completion + 1, (B,), generator=g)
    P, C = int(plen.max()), int(clen.max())
    pmask = torch.arange(P)[None] >= P - plen[:, None]
    cmask = torch.arange(C)[None] < clen[:, None]
    return RolloutBatch.fresh(
        prompt_ids=(torch.randint(1, 50_000, (B, P), generator=g) * pmask).int(), prompt_mask=pmask,
        completion_ids=(torch.randint(1, 50_000, (B, C), generator=g) * cmask).int(), completion_mask=cmask,
        behaviour_logps=-torch.rand(B, C, generator=g) * cmask, advantages=adv, rewards=rewards,
        group_ids=group_ids, group_std=std, step=0)


def copy_pairs(buf: ReplayBuffer, fresh: RolloutBatch, replay: RolloutBatch) -> list[tuple[np.ndarray, np.ndarray]]:
    """(source, destination) arrays whose copies move what one step's bookkeeping must move: each fresh field
    into rows of its arena's width (the rest of a row zeroed), and each field of the replay batch out."""
    st, n = buf.storage, len(fresh)
    pairs = []
    widths = st.arena_widths()
    for field, arena in (("prompt_ids", "prompt_ids"), ("completion_ids", "comp_ids"), ("behaviour_logps", "logps")):
        src = getattr(fresh, field).numpy()
        if not isinstance(st.completions, PaddedArena) and arena != "prompt_ids":  # unpadded: the real positions only, into one run
            real = src[fresh.completion_mask.numpy()]
            pairs.append((real, np.empty_like(real)))
            continue
        W, w = widths[arena], src.shape[1]
        dst = np.zeros((n, W), src.dtype)
        if W > w:
            pairs.append((np.zeros((n, W - w), src.dtype), dst[:, w:] if arena != "prompt_ids" else dst[:, : W - w]))
        pairs.append((src, dst[:, :w] if arena != "prompt_ids" else dst[:, W - w :]))
    for t in vars(replay).values():
        if isinstance(t, torch.Tensor):
            a = t.numpy()
            pairs.append((a.copy(), np.empty_like(a)))
    return pairs


def random_row_copies(buf: ReplayBuffer, fresh: RolloutBatch, replay: RolloutBatch, slots: np.ndarray,
                      pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """The copy floor's bytes, but the replay batch's token rows read from where a draw must read them: its
    slots' rows of the padded arenas (`np.take` of whole rows into arrays allocated beforehand; no padded
    storage can read fewer bytes), the rest copied as in the copy floor. The gap between this floor and the
    copy floor is what reading rows scattered over the arenas costs, whatever the code around it."""
    st = buf.storage
    from_arena = {"prompt_ids": st.prompt_ids, "completion_ids": st.completions.arrays["comp_ids"],
                  "behaviour_logps": st.completions.arrays["logps"]}
    replay_fields = [k for k, t in vars(replay).items() if isinstance(t, torch.Tensor)]
    first_replay = len(pairs) - len(replay_fields)
    np.count_nonzero(fresh.completion_mask.numpy())
    for i, (src, dst) in enumerate(pairs):
        field = replay_fields[i - first_replay] if i >= first_replay else None
        if field in from_arena:
            arena = from_arena[field]
            key = (field, len(slots), arena.shape[1])
            if key not in _ROWS_OUT:
                _ROWS_OUT[key] = np.empty((len(slots), arena.shape[1]), arena.dtype)
            np.take(arena, slots, axis=0, out=_ROWS_OUT[key])
        else:
            np.copyto(dst, src)


_ROWS_OUT: dict[tuple, np.ndarray] = {}


_SCRATCH = np.zeros(0, np.uint8)


def flush_caches() -> None:
    """Write 64 MB, more than the last-level cache holds: what a step reads next comes from memory, as in a
    trainer, whose model work between two steps evicts the buffer's data from the caches."""
    global _SCRATCH
    if not len(_SCRATCH):
        _SCRATCH = np.zeros(64 << 20, np.uint8)
    _SCRATCH += 1


def bench_paper_default(repeats: int, unpadded: bool = False) -> dict:
    cfg = ReplayConfig(warmup_steps=0)
    buf = ReplayBuffer(cfg, seed=0, storage=RolloutStorage(unpadded=unpadded))
    fresh = make_batch(64, 8, 1, 256, 2048)
    for t in range(11):
        buf.add(fresh, t)
    n_replay = round(cfg.replay_ratio * len(fresh))
    names = ("evict", "sample", "gather", "add", "compose")
    times = {k: [] for k in names}
    replay = None
    for s in range(11, 11 + repeats):
        flush_caches()
        for k in names:
            w0, c0 = time.perf_counter(), time.thread_time()
            if k == "evict":
                buf.evict(s)
            elif k == "sample":
                slots = buf.sampler.sample(buf.storage, n_replay, buf.rng)
            elif k == "gather":
                replay = buf.gather(slots)
            elif k == "add":
                buf.add(fresh, s)
            else:  # what compose_batch does after the draw, and the micro-batches the trainer cuts
                composed, _ = fresh_anchored(fresh, lambda n: replay, cfg.replay_ratio, buf.rng)
                list(composed.micro_batches(None))
            times[k].append(((time.perf_counter() - w0) * 1e3, (time.thread_time() - c0) * 1e3))
    pairs = copy_pairs(buf, fresh, replay)
    fresh_mask = fresh.completion_mask.numpy()
    floor = []
    for _ in range(repeats):
        flush_caches()
        w0, c0 = time.perf_counter(), time.thread_time()
        np.count_nonzero(fresh_mask)  # any layout reads the fresh mask once, to learn the rows' lengths
        for src, dst in pairs:
            np.copyto(dst, src)
        floor.append(((time.perf_counter() - w0) * 1e3, (time.thread_time() - c0) * 1e3))
    rows_floor = []
    for _ in range(repeats if isinstance(buf.storage.completions, PaddedArena) else 0):
        flush_caches()
        w0, c0 = time.perf_counter(), time.thread_time()
        random_row_copies(buf, fresh, replay, slots, pairs)
        rows_floor.append(((time.perf_counter() - w0) * 1e3, (time.thread_time() - c0) * 1e3))
    book = [tuple(sum(times[k][i][j] for k in ("evict", "sample", "gather", "add")) for j in (0, 1)) for i in range(repeats)]
    return {"stored": len(buf), "fresh": len(fresh), "replay": n_replay, "bytes_per_row": buf.storage.nbytes() / len(buf),
            "ops": {k: summary(v) for k, v in times.items()}, "bookkeeping": summary(book), "floor": summary(floor),
            "rows_floor": summary(rows_floor) if rows_floor else None,
            "floor_bytes": sum(d.nbytes for _, d in pairs),
            "real_token_bytes": int(fresh.completion_mask.sum()) * 8 + int(replay.completion_mask.sum()) * 9}


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{model}, {platform.machine()}, {os.cpu_count()} cores, load average {load:.1f}; python "
            f"{platform.python_version()}, numpy {np.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads)")


def print_peers(peers: dict, rounds: int, steps: int) -> None:
    names = list(next(iter(peers["rows"].values())).keys())
    print(f"\nequal work, {rounds} rounds x {steps} steps per library, interleaved; ms per op, wall min / median "
          f"(thread CPU min / median):")
    print("| N | op | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for n, row in peers["rows"].items():
        for op in ("step", "add", "evict", "sample"):
            cell = lambda r: (f"{r['wall_min']:.2f} / {r['wall_med']:.2f} ({r['cpu_min']:.2f} / {r['cpu_med']:.2f})"  # noqa: E731
                              if r else "(in add)")
            label = {"step": "**whole step**", "add": f"add {PER_STEP}", "evict": f"evict {PER_STEP} oldest",
                     "sample": f"sample {DRAW} with data"}[op]
            print(f"| {int(n):,} | {label} | " + " | ".join(cell(row[k].get(op)) if k in row else "n/a" for k in names) + " |")
    print("\nwhole step, peer time / our time (medians; above 1: ours faster):")
    for n, row in peers["rows"].items():
        ratios = [f"{k} / {o}: {row[k]['step']['wall_med'] / row[o]['step']['wall_med']:.2f}x wall, "
                  f"{row[k]['step']['cpu_med'] / row[o]['step']['cpu_med']:.2f}x CPU"
                  for k in names if k in row and not k.startswith("ours")
                  for o in ("ours", "ours, with repl.", "ours, unpadded") if o in row]
        print(f"  N = {int(n):,}: " + ("; ".join(ratios) or "no peer available"))
    for k, why in peers["missing"].items():
        print(f"unavailable: {k} ({why})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=8, help="steps per library per round")
    ap.add_argument("--rss-sizes", default="1000000", help="sizes for the memory children ('' for none)")
    ap.add_argument("--repeats", type=int, default=20, help="paper-default steps")
    ap.add_argument("--skip-paper", action="store_true")
    ap.add_argument("--rss-child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.rss_child:
        print(json.dumps(rss_child(a.rss_child[0], int(a.rss_child[1]))))
        return
    from grpo_replay.app.provenance import git_commit

    print(f"{machine()}; commit {git_commit()}")
    t0 = time.perf_counter()
    peers = bench_peers([int(x) for x in a.sizes.split(",")], a.rounds, a.steps)
    print_peers(peers, a.rounds, a.steps)
    if a.rss_sizes:
        print(f"\nmemory ({PER_STEP * 20} rows turned over first): resident set growth per row, and ours' buffer/bytes per row")
        for n, row in bench_rss([int(x) for x in a.rss_sizes.split(",")]).items():
            cells = [f"{k} {v['rss_per_row']:.0f} B" + (f" (buffer/bytes {v['nbytes_per_row']:.0f} B)" if "nbytes_per_row" in v else "")
                     if isinstance(v, dict) else f"{k}: failed {v!r}" for k, v in row.items()]
            print(f"  N = {n:,}: " + "; ".join(cells))
    for unpadded in () if a.skip_paper else (False, True):
        p = bench_paper_default(a.repeats, unpadded)
        fmt = lambda r: f"{r['wall_min']:.2f} / {r['wall_med']:.2f} ms (CPU {r['cpu_min']:.2f} / {r['cpu_med']:.2f})"  # noqa: E731
        b, f = p["bookkeeping"], p["floor"]
        print(f"\npaper default, {'unpadded' if unpadded else 'padded'} storage: {p['stored']:,} stored rows ({p['bytes_per_row']:.0f} bytes each), a step of {p['fresh']} "
              f"fresh + {p['replay']} replay rows; min / median of {a.repeats}:")
        for k, r in p["ops"].items():
            print(f"  {k}: {fmt(r)}")
        print(f"  bookkeeping (evict + sample + gather + add): {fmt(b)}\n  copy floor ({p['floor_bytes'] / 1e6:.1f} MB "
              f"written, {p['floor_bytes'] / f['wall_med'] / 1e6:.1f} GB/s): {fmt(f)}\n  bookkeeping / floor (medians): "
              f"{b['wall_med'] / f['wall_med']:.2f}x wall, {b['cpu_med'] / f['cpu_med']:.2f}x CPU (target <= 1.2)\n"
              f"  real tokens only (ids + log-probs in, ids + log-probs + mask out): {p['real_token_bytes'] / 1e6:.1f} MB")
        if p["rows_floor"]:
            r = p["rows_floor"]
            print(f"  random-row floor (the same, the replay token rows read from their slots): {fmt(r)}\n"
                  f"  bookkeeping / random-row floor (medians): {b['wall_med'] / r['wall_med']:.2f}x wall, "
                  f"{b['cpu_med'] / r['cpu_med']:.2f}x CPU; random-row / copy floor: {r['wall_med'] / f['wall_med']:.2f}x")
    print(f"\nwhole command: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
