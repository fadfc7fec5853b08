"""Fixed-seed records of every trainer, to show a refactor left training unchanged: capture before, capture after, diff.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/trainer_records.py capture before.json --trainers builtin,trl_sync,trl_async
    .venv-verl/bin/python benchmarks/trainer_records.py capture before-verl.json --trainers verl_v1,verl_legacy
    python benchmarks/trainer_records.py diff before.json after.json

Each trainer runs a few steps at a tiny shape with replay on (the paper preset, warm-up 0 or 1), driven the way its
tests drive it (tests/integrations' drivers): the built-in trainer through `grpo-replay train`, TRL sync and async
through their real `train()`, verl v1 through its real `fit()` (sync mode, Ray and TransferQueue, the fake actor),
verl legacy through its `_update_actor` on verl's own batches. A record is every logged metric per step (time and
throughput keys left out: they are wall-clock) and what was trained: a digest of the final weights (built-in, TRL)
or of every row each update received (verl's fake actors). `diff` prints, per trainer, the keys only one side logs
and every value that differs; it exits 1 when a trained digest or a shared key's value differs.
Records compare only on one machine and CPU kind (floats differ between kinds).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
for sub in ("tests", "tests/integrations", "tests/integrations/verl_integration"):
    sys.path.insert(0, str(ROOT / sub))

WALL_CLOCK = ("time/", "step_time", "perf/", "timing", "throughput", "_runtime", "train_runtime", "samples_per_second",
              "steps_per_second", "total_flos")


def _clean(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        if any(w in k for w in WALL_CLOCK):
            continue
        if isinstance(v, (int, float, bool, str)) or v is None:
            out[k] = v
        elif hasattr(v, "tolist"):
            out[k] = v.tolist()
    return out


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


# --- the trainers ---------------------------------------------------------------------------------------------
def builtin() -> dict:
    from helpers import TINY, read_jsonl

    from grpo_replay.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        sets = {**TINY, "testbed.cache_dir": f"{tmp}/cache", "steps": 6, "eval_every": 6, "checkpoint_every": 6,
                "replay.warmup_steps": 1}
        argv = ["train", "--out", f"{tmp}/run", "--no-progress"]
        for k, v in sets.items():
            if k == "progress":
                continue
            argv += ["--set", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
        assert main(argv) == 0
        rows = read_jsonl(Path(tmp) / "run" / "metrics.jsonl")
        from safetensors.torch import load_file

        files = sorted(Path(tmp, "run").glob("ckpt-*/model/*.safetensors"))
        state = {k: v for f in files for k, v in load_file(str(f)).items()}
        weights = _digest([state[k] for k in sorted(state)]) if state else None
    return {"steps": [_clean(r) for r in rows], "trained": weights}


def _trl_history(trainer) -> list[dict]:
    return [_clean(r) for r in trainer.state.log_history]


def trl_sync() -> dict:
    from test_trl import make_trainer

    with tempfile.TemporaryDirectory() as tmp:
        t = make_trainer(tmp, replay_preset="paper", max_steps=4)
        t.train()
        return {"steps": _trl_history(t), "trained": _digest(t.model.parameters())}


def trl_async() -> dict:
    from async_setup import make_async_trainer

    with tempfile.TemporaryDirectory() as tmp:
        t = make_async_trainer(Path(tmp), replay_preset="paper", max_steps=4)
        t.train()
        return {"steps": _trl_history(t), "trained": _digest(t.model.parameters())}


def verl_v1() -> dict:
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from v1_driver import run_fit
    from v1_setup import RATIO, by_step, replay_cls, v1_config

    src = str(ROOT / "src")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": src}})
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 2}}}))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t = run_fit(replay_cls("sync"), v1_config(Path(tmp), "sync", *RATIO))
            steps = [_clean({"step": s, **t.step_metrics[s]}) for s in sorted(t.step_metrics)]
            updates = [u for us in by_step(t).values() for u in us]
            keys = hashlib.sha256(json.dumps([[u["step"], u["mini_batch_size"], u["keys"]] for u in updates]).encode())
            trained = f"{_digest(t.actor_rollout_wg.model.parameters())}-{keys.hexdigest()[:16]}"
            return {"steps": steps, "trained": trained}
    finally:
        tq.close()
        ray.shutdown()


def verl_legacy() -> dict:
    from test_trainer_on_cpu import make_trainer, verl_config
    from verl_batches import make_batch

    with tempfile.TemporaryDirectory() as tmp:
        t = make_trainer(verl_config(Path(tmp), "replay.tau_max=2", "replay.replay_ratio=0.5"), 2)
        steps = []
        for step in range(1, 7):
            t.global_steps = step
            out = t._update_actor(make_batch(step, n_prompts=8, n=4))
            steps.append(_clean({"step": step, **out.meta_info["metrics"]}))
        sent = t.actor_rollout_wg.updates
        flat = lambda t: t.values() if t.is_nested else t  # noqa: E731
        trained = _digest([flat(u[k]) for u in sent for k in ("advantages", "old_log_probs")])
        return {"steps": steps, "trained": trained}


TRAINERS = {"builtin": builtin, "trl_sync": trl_sync, "trl_async": trl_async, "verl_v1": verl_v1,
            "verl_legacy": verl_legacy}


# --- capture and diff -----------------------------------------------------------------------------------------
def capture(out: str, names: list[str]) -> None:
    records = {}
    for name in names:
        print(f"{name} ...", flush=True)
        records[name] = TRAINERS[name]()
    Path(out).write_text(json.dumps(records, indent=1, sort_keys=True))
    print(f"wrote {out}")


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def diff(a_path: str, b_path: str) -> int:
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    bad = 0
    for name in sorted(set(a) & set(b)):
        ra, rb = a[name], b[name]
        only_a, only_b, changed = set(), set(), []
        for i, (sa, sb) in enumerate(zip(ra["steps"], rb["steps"])):
            only_a |= set(sa) - set(sb)
            only_b |= set(sb) - set(sa)
            changed += [(i, k, sa[k], sb[k]) for k in sorted(set(sa) & set(sb)) if not _same(sa[k], sb[k])]
        same_trained = ra["trained"] == rb["trained"]
        print(f"{name}: {len(ra['steps'])} vs {len(rb['steps'])} records; trained {'identical' if same_trained else 'DIFFERS'};"
              f" {len(changed)} changed values")
        if only_a:
            print(f"  only in {a_path}: {sorted(only_a)}")
        if only_b:
            print(f"  only in {b_path}: {sorted(only_b)}")
        for i, k, va, vb in changed[:20]:
            print(f"  record {i} {k}: {va} -> {vb}")
        bad += (not same_trained) + len(changed) + (len(ra["steps"]) != len(rb["steps"]))
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture")
    c.add_argument("out")
    c.add_argument("--trainers", default="builtin,trl_sync,trl_async")
    d = sub.add_parser("diff")
    d.add_argument("a")
    d.add_argument("b")
    args = p.parse_args(argv)
    if args.command == "diff":
        return diff(args.a, args.b)
    names = [n for n in args.trainers.split(",") if n]
    unknown = [n for n in names if n not in TRAINERS]
    if unknown:
        p.error(f"--trainers: unknown {unknown}; allowed: {sorted(TRAINERS)}")
    capture(args.out, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
