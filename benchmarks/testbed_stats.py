"""Warm-start statistics of a named testbed config: pass rate, completion length, working rate, and the pass
rate with the working forced vs forbidden (does writing the working help?).

Usage:
  .venv/bin/python benchmarks/testbed_stats.py [--testbed default|reasoning] [--set KEY=VALUE ...]
      [--problems 256] [--samples 8] [--json FILE]

The warm start is `warm_start(TestbedConfig.named(NAME, **sets))`: loaded from the cache
(`$GRPO_REPLAY_CACHE/testbed/<config hash>`) when present, else trained and cached; its own `info.json` numbers
(selection pass rate, step, seconds) are printed with the statistics measured here on `--problems` held-out
problems (`task.heldout(n, seed=12345)`, the trainer's held-out set) with `--samples` completions each:
the trainer's own held-out evaluation (`trainer.evaluation.evaluate`: sampled pass rate, mean completion length in
tokens incl. EOS over all / correct / incorrect samples, the `len_*` metrics of evals.jsonl) and `stats.forced_mode_pass_rate`
(working forced: the prompt ends in `[`; forbidden: `[` is a bad word).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import typing
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from grpo_replay.app.configio import check_value, parse_value  # noqa: E402
from grpo_replay.tasks.testbed import TestbedConfig, TestbedTask, forced_mode_pass_rate, warm_start  # noqa: E402
from grpo_replay.tasks.testbed.testbed_config import TESTBED_PRESETS  # noqa: E402
from grpo_replay.trainer.evaluation import evaluate  # noqa: E402


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--testbed", default="reasoning", choices=TESTBED_PRESETS)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a TestbedConfig field")
    ap.add_argument("--problems", type=int, default=256)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--json", help="also write the numbers to this file")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    sets, fields = {}, typing.get_type_hints(TestbedConfig)
    for item in a.set:
        k, v = item.split("=", 1)
        key = k.removeprefix("testbed.")
        if key not in fields:
            ap.error(f"--set {item}: unknown key {k!r}; allowed: the TestbedConfig fields")
        sets[key] = check_value(k, parse_value(v), fields[key])  # the field's type, as `grpo-replay train` does
    cfg = TestbedConfig.named(a.testbed, **sets)
    t0 = time.perf_counter()
    model, tok, info = warm_start(cfg, progress=True)
    took = time.perf_counter() - t0
    task = TestbedTask(cfg, tok)
    problems = task.heldout(a.problems, seed=12345)
    ev = evaluate(model, tok, task, problems, a.samples, cfg.max_new_tokens, temperature=1.0, seed=1)
    ls = {"pass_rate": ev["acc_sampled"], "pass_rate_greedy": ev["acc_greedy"],
          **{k: ev[k] for k in ("len_all", "len_correct", "len_incorrect")}}
    forced = forced_mode_pass_rate(model, task, problems, working=True, n_samples=a.samples, seed=2)
    forbidden = forced_mode_pass_rate(model, task, problems, working=False, n_samples=a.samples, seed=2)
    w = {d: sum(p.difficulty == d for p in problems) for d in forced}
    avg = lambda r: sum(r[d] * w[d] for d in r) / sum(w.values())  # noqa: E731
    out = {
        "testbed": a.testbed, "cache_key": cfg.cache_key(), "n_params": info["n_params"],
        "warm_start": {k: info[k] for k in ("pass_rate", "step", "steps_run", "stop_reason", "seconds")},
        "from_cache": info["from_cache"], "load_or_train_seconds": took,
        "heldout": {"problems": len(problems), "samples": a.samples, **ls},
        "forced_working": {"pass_rate": avg(forced), "by_difficulty": forced},
        "forbidden_working": {"pass_rate": avg(forbidden), "by_difficulty": forbidden},
    }
    f = lambda r: " ".join(f"{d}:{v:.2f}" for d, v in r.items())  # noqa: E731
    ws = out["warm_start"]
    print(f"testbed {a.testbed} ({cfg.cache_key()}, {info['n_params']} parameters)\n"
          f"  warm start: step {ws['step']} of {ws['steps_run']} ({ws['stop_reason']}), selection pass rate "
          f"{ws['pass_rate']:.3f}, {ws['seconds']:.0f} s{' (cached)' if info['from_cache'] else ''}\n"
          f"  held-out ({len(problems)} x {a.samples}): pass rate {ls['pass_rate']:.3f}, mean length {ls['len_all']:.2f} "
          f"tokens (correct {_num(ls['len_correct'])}, incorrect {_num(ls['len_incorrect'])}); greedy pass rate "
          f"{ls['pass_rate_greedy']:.3f}\n"
          f"  working forced:    pass rate {avg(forced):.3f}  by level {f(forced)}\n"
          f"  working forbidden: pass rate {avg(forbidden):.3f}  by level {f(forbidden)}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
