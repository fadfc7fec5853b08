"""A few steps of the built-in trainer and of the TRL backend, with replay's invariants checked on every batch.

`scripts/gpu_smoke.sh` runs it on one CUDA device in bf16; the test suite runs it on CPU in float32
(`--device cpu --dtype float32`). The model is the testbed's, built from its config and warm-started.

Checked on every composed batch (the call to `compose_batch` in each trainer is wrapped, nothing else is
touched): no replay row of age 0 or older than tau_max, none with an empty completion mask, and the replay
row count the composition promises (fresh_anchored: min(round(replay_ratio * n_fresh), rows stored) after
warm-up, 0 before; pool: a fixed total with at most round(n * r / (1 + r)) replay rows). The TRL run trains in
micro-batches (steps_per_generation > 1), so its composed rows are cut to TRL's split: the replay rows that reach
the loss are counted per step and must be those the split keeps, and all the planned ones whenever the buffer
could supply the draw (the share after trimming is the configured one). Per run: every logged loss finite, no
skipped update, and replay rows seen at all (else the checks above were vacuous).
Exit 0 if everything holds, 1 with the list of violations.

The TRL run calls `train_testbed_with_trl` (trainer/trl/backend.py), the function behind `grpo-replay train --backend
trl`, so that it can pass `use_cpu` and `bf16` itself.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from grpo_replay.app.run_files import METRICS
from grpo_replay.config import ReplayConfig
from grpo_replay.experiments.arms import TINY_TESTBED
from grpo_replay.rollout import RolloutBatch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def check_composed(batch: RolloutBatch, n_fresh: int, step: int, stored: int, cfg: ReplayConfig,
                   asked: int | None = None) -> list[str]:
    """Violations in one composed batch built at optimizer step `step` from n_fresh fresh rows, with `stored`
    rows in the buffer after the draw's eviction; `asked`: the replay rows the step plan asked for (the plan's count
    fitted to the engine's unit), None: the composition's own count."""
    out = []
    rep = batch.is_replay.cpu()
    ages = batch.age(step).cpu()[rep]
    if ages.numel() and int(ages.min()) <= 0:
        out.append(f"step {step}: a replay row of age {int(ages.min())} (a step must not replay its own rows)")
    if ages.numel() and cfg.tau_max is not None and int(ages.max()) > cfg.tau_max:
        out.append(f"step {step}: a replay row of age {int(ages.max())} > tau_max={cfg.tau_max}")
    empty = int((batch.completion_mask.cpu()[rep].sum(1) == 0).sum())
    if empty:
        out.append(f"step {step}: {empty} replay rows with an empty completion mask")
    n_rep = int(rep.sum())
    warm = cfg.enabled and step >= cfg.warmup_steps
    if cfg.composition == "fresh_anchored" and cfg.granularity == "rollout":
        want = min(round(cfg.replay_ratio * n_fresh) if asked is None else asked, stored) if warm else 0
        if n_rep != want:
            out.append(f"step {step}: {n_rep} replay rows for {n_fresh} fresh rows; expected {want}")
    elif cfg.composition == "pool":
        cap = (round(n_fresh * cfg.replay_ratio / (1 + cfg.replay_ratio)) if asked is None else asked) if warm else 0
        if len(batch) != n_fresh or n_rep > cap:
            out.append(f"step {step}: pool of {len(batch)} rows ({n_rep} replay) for {n_fresh} fresh; at most {cap} replay")
    return out


class Recorder:
    """Wraps `compose_batch` (each trainer composes through its ReplaySession) and checks every batch it returns."""

    def __init__(self, name: str):
        self.name, self.problems, self.batches, self.replay_rows = name, [], 0, 0
        self.composed: dict[int, tuple[int, int, int]] = {}  # step -> (fresh rows, replay rows, planned replay rows)

    def wrap(self, compose: Callable) -> Callable:
        def checked(fresh, buffer, step, *args, **kw):
            res = compose(fresh, buffer, step, *args, **kw)
            batch = res.batch
            self.problems += [f"{self.name}: {p}" for p in check_composed(batch, len(fresh), step, len(buffer), buffer.config,
                                                                          kw.get("n_replay"))]
            self.batches += 1
            n_rep = int(batch.is_replay.sum())
            self.replay_rows += n_rep
            cfg = buffer.config
            planned = round(cfg.replay_ratio * len(fresh)) if cfg.enabled and step >= cfg.warmup_steps else 0
            self.composed[step] = (len(res.fresh_index), n_rep, planned)
            return res

        return checked

    def finish(self, losses: list[Any]) -> None:
        bad = [x for x in losses if x is None or not math.isfinite(x)]
        if not losses or bad:
            self.problems.append(f"{self.name}: {len(bad)} of {len(losses)} logged losses are missing or not finite")
        if not self.replay_rows:
            self.problems.append(f"{self.name}: no replay row in {self.batches} composed batches; nothing was checked")


def check_trained(composed: dict[int, tuple[int, int, int]], trained: dict[int, int], unit: int) -> list[str]:
    """Violations between the composed replay rows of each step and those that reached the loss under an engine
    that cuts the composed rows to a multiple of `unit` by dropping replay rows."""
    out, full = [], 0
    for step, (n_fresh, n_rep, planned) in sorted(composed.items()):
        keep = n_fresh + n_rep - (n_fresh + n_rep) % unit - n_fresh
        got = trained.get(step, 0)
        if got != keep:
            out.append(f"step {step}: {got} replay rows reached the loss; {n_rep} composed, {keep} kept by the split")
        if n_rep == planned > 0:
            full += 1
            if got != planned:
                out.append(f"step {step}: {got} of {planned} planned replay rows trained after the split into "
                           f"{unit} micro-batches: the share is not the configured one")
    if not full:
        out.append("no step drew its full replay count, so the share after the split was never checked")
    return out


def train_config(args: argparse.Namespace, out: Path):
    from grpo_replay.trainer.train_config import resolve

    return resolve({
        **TINY_TESTBED,
        "testbed.cache_dir": str(args.cache_dir or args.out / "testbed-cache"),
        "out_dir": str(out),
        "device": args.device,
        "steps": args.steps,
        "prompts_per_step": 8,
        "group_size": 4,
        "lr": 3e-3,
        "eval_every": 0,
        "eval_problems": 16,
        "eval_samples": 1,
        "checkpoint_every": 0,
        "progress": False,
        "replay.warmup_steps": 1,
        "replay.tau_max": 2,  # short enough that eviction by age happens within a few steps
        "replay.replay_ratio": 1.0,
    })


def run_builtin(args: argparse.Namespace) -> Recorder:
    import grpo_replay.session as session_mod
    import grpo_replay.trainer.loop as loop

    rec = Recorder("builtin")
    cfg = train_config(args, args.out / "builtin")
    real_compose, real_build = session_mod.compose_batch, loop.build_policy

    def build_in_dtype(c, device):
        model, *rest = real_build(c, device)
        return (model.to(DTYPES[args.dtype]), *rest)

    session_mod.compose_batch, loop.build_policy = rec.wrap(real_compose), build_in_dtype
    try:
        loop.train(cfg)
    finally:
        session_mod.compose_batch, loop.build_policy = real_compose, real_build
    rows = [json.loads(x) for x in (cfg.run_dir / METRICS).read_text().splitlines()]
    if any(r["skipped_nonfinite"] for r in rows):
        rec.problems.append("builtin: a step skipped its update for a non-finite loss")
    rec.finish([r["loss"] for r in rows if r["update_rows"]])
    return rec


def run_trl(args: argparse.Namespace) -> Recorder:
    import grpo_replay.integrations.trl.replay_grpo_trainer as trl_trainer
    import grpo_replay.session as session_mod
    from grpo_replay.trainer.trl.backend import train_testbed_with_trl

    rec = Recorder("trl")
    # Micro-batches of 8 fresh rows: TRL splits each step's 32 + 8 composed rows into 4 forwards of 10.
    cfg = train_config(args, args.out / "trl")
    cfg = dataclasses.replace(cfg, micro_batch_size=8, replay=dataclasses.replace(cfg.replay, replay_ratio=0.25))
    trained: dict[int, int] = {}
    real_compose, real_loss = session_mod.compose_batch, trl_trainer.ReplayGRPOTrainer._compute_loss

    def counted_loss(self, model, inputs):  # the rows TRL's split hands to the loss, replay ones counted per step
        flag = inputs.get(trl_trainer.REPLAY_FLAG_KEY)
        step = int(self.state.global_step)
        trained[step] = trained.get(step, 0) + (int(flag.sum()) if flag is not None else 0)
        return real_loss(self, model, inputs)

    session_mod.compose_batch = rec.wrap(real_compose)
    trl_trainer.ReplayGRPOTrainer._compute_loss = counted_loss
    try:
        res = train_testbed_with_trl(cfg, use_cpu=args.device == "cpu", bf16=args.dtype == "bfloat16")
    finally:
        session_mod.compose_batch, trl_trainer.ReplayGRPOTrainer._compute_loss = real_compose, real_loss
    spg = res["trainer"].args.steps_per_generation
    rec.problems += [f"trl: {p}" for p in check_trained(rec.composed, trained, spg)]
    rec.finish([h["loss"] for h in res["log_history"] if "loss" in h])
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out", type=Path, default=Path("runs/smoke"))
    p.add_argument("--only", choices=("builtin", "trl"), default=None)
    p.add_argument("--cache-dir", type=Path, default=None, help="testbed warm-start cache (default: OUT/testbed-cache)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("smoke_check: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    if args.out.exists() and any(args.out.iterdir()):
        print(f"smoke_check: {args.out} is not empty; pass a new --out", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    recs = [run(args) for name, run in (("builtin", run_builtin), ("trl", run_trl)) if args.only in (None, name)]
    problems = [x for r in recs for x in r.problems]
    for r in recs:
        print(f"smoke_check {r.name}: {r.batches} composed batches, {r.replay_rows} replay rows checked "
              f"({args.device}, {args.dtype})")
    for x in problems:
        print(f"VIOLATION {x}")
    print("smoke_check: " + ("FAILED" if problems else "all invariants hold"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
