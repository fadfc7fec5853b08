"""metrics.jsonl for `--backend trl`: one row per optimizer step under the built-in trainer's names and units, so
`grpo-replay plot`, compare and the report read a TRL run like a built-in one.

The row is made from TRL's log of the step (`ReplayGRPOTrainer` logs the replay split under the built-in names:
replay/share, fresh/ and replay/ abs_adv, clip_frac, ratio_mean, replay/age_mean, ...). Keys TRL has no counterpart
for (ratio_max, age_hist, the buffer/evicted_* counters) are absent rather than made up.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

METRICS = "metrics.jsonl"

# built-in name <- TRL's log key, same unit (means over the step's generated rollouts / update tokens)
RENAMED = {
    "reward": "reward",
    "frac_zero_var_groups": "frac_reward_zero_std",
    "completion_len": "completions/mean_length",
    "loss": "loss",
    "kl": "kl",
    "grad_norm": "grad_norm",
    "lr": "learning_rate",
    "buffer/size": "replay/buffer_size",
    "time/step_s": "step_time",
}
SHARED = ("replay/share", "replay/age_mean", "replay/age_max", "fresh/abs_adv", "replay/abs_adv",
          "fresh/clip_frac", "replay/clip_frac", "fresh/ratio_mean", "replay/ratio_mean")


def metrics_row(logs: dict[str, Any], step: int, rollouts_per_step: int) -> Optional[dict[str, Any]]:
    """The metrics.jsonl row of optimizer step `step` from TRL's log of it; None for a log that is not a training
    step's (TRL's end-of-training summary). rollouts_per_step = prompts_per_step x group_size."""
    if "reward" not in logs:
        return None
    row: dict[str, Any] = {"step": step, "generated": step * rollouts_per_step}
    row.update({name: logs[key] for name, key in RENAMED.items() if key in logs})
    row.update({name: logs[name] for name in SHARED if name in logs})
    if "replay/rows" in logs:
        # update rows: replay rows over their share; without replay, every generated row (TRL's update keeps the
        # zero-variance groups, at advantage 0, where the built-in trainer drops them)
        replay = int(round(logs["replay/rows"]))
        share = logs.get("replay/share", 0.0)
        rows = int(round(replay / share)) if replay and share else rollouts_per_step
        row.update({"update_rows": rows, "fresh/count": rows - replay, "replay/count": replay})
    if "replay/age_max" in row:
        row["replay/age_max"] = int(row["replay/age_max"])
    return row


def start(run_dir: Path, resume_step: Optional[int]) -> None:
    """A new run starts metrics.jsonl empty; a resumed one keeps its rows up to the checkpoint's step (the later
    ones are redone), as the built-in trainer does."""
    path = Path(run_dir) / METRICS
    if resume_step is None or not path.exists():
        path.write_text("")
        return
    rows = [r for r in path.read_text().splitlines() if r.strip() and json.loads(r).get("step", 0) <= resume_step]
    path.write_text("".join(r + "\n" for r in rows))


def callback(run_dir: Path, rollouts_per_step: int):
    """A TrainerCallback appending `metrics_row` of every logged training step to run_dir/metrics.jsonl."""
    from transformers import TrainerCallback

    class MetricsLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **_):
            row = metrics_row(logs or {}, state.global_step, rollouts_per_step)
            if row is not None and state.is_world_process_zero:
                with open(Path(run_dir) / METRICS, "a") as f:
                    f.write(json.dumps(row) + "\n")

    return MetricsLog()
