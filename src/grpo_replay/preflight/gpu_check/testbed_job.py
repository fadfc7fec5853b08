"""Check (a): the main job (`grpo-replay train`, the paper's method on the embedded testbed) on the device, as a
user runs it (a process of its own, the real command), with its held-out figures and step time."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from ...app.run_files import METRICS, SUMMARY
from .report import Result

# The dry run's toy testbed (the test suite's tiny settings): a 1-layer model, a short warm start, 2 steps.
TINY_SETS = {"steps": 2, "prompts_per_step": 4, "eval_every": 2, "eval_problems": 8, "eval_samples": 1,
             "testbed.digits_max": 1, "testbed.difficulty_weights": "[1.0]", "testbed.working_prob": "[0.2]",
             "testbed.hidden_size": 32, "testbed.num_layers": 1, "testbed.num_heads": 2,
             "testbed.intermediate_size": 64, "testbed.warmstart_max_steps": 20, "testbed.warmstart_batch": 16,
             "testbed.warmstart_eval_every": 10, "testbed.warmstart_eval_problems": 16}


def command(out: Path, device: str, tiny: bool) -> list[str]:
    sets = [x for k, v in (TINY_SETS.items() if tiny else ()) for x in ("--set", f"{k}={v}")]
    return [sys.executable, "-m", "grpo_replay.cli", "train", "--out", str(out), "--device", device, "--no-progress",
            "--set", f"testbed.cache_dir={out.parent / 'testbed-cache'}", *sets]


def check(res: Result, out: Path, device: str, tiny: bool, timeout: float) -> None:
    argv = command(out, device, tiny)
    res.figures["command"] = " ".join(["grpo-replay", *argv[3:]])
    log = out.parent / "testbed.log"
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        log.write_text(_text(e.stdout) + _text(e.stderr))
        res.figures.update(step_times(out))
        res.status = "failed"
        res.why = f"the main job did not finish within {timeout:.0f} s (--testbed-timeout; log {log})"
        return
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        res.status = "failed"
        res.why = f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or ['(no output)'])[-1][:500]} (log {log})"
        return
    summary = json.loads((out / SUMMARY).read_text())
    sampled, greedy = summary["heldout_acc_sampled"], summary["heldout_acc_greedy"]
    res.figures.update({
        "steps": summary["steps"],
        "held-out sampled accuracy, start -> end": f"{sampled['start']:.3f} -> {sampled['end']:.3f}",
        "held-out greedy accuracy, start -> end": f"{greedy['start']:.3f} -> {greedy['end']:.3f}",
        **step_times(out),
        "skipped non-finite steps": summary.get("skipped_nonfinite_steps", 0),
        "run folder": str(out),
    })
    if summary.get("skipped_nonfinite_steps"):
        res.status, res.why = "failed", f"{summary['skipped_nonfinite_steps']} steps had a non-finite loss"


def step_times(out: Path) -> dict:
    """Step time and replay rows over the steps metrics.jsonl holds (all of them, or those done before a timeout)."""
    path = out / METRICS
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    step_s = [r["time/step_s"] for r in rows if "time/step_s" in r]
    return {"steps logged": len(rows),
            "step time, median s": round(statistics.median(step_s), 4) if step_s else None,
            "step time, mean s": round(statistics.fmean(step_s), 4) if step_s else None,
            "replay rows, total": sum(int(r.get("replay/count", 0) or 0) for r in rows)}


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
