"""metrics.jsonl for `--backend trl`: one row per optimizer step under the built-in trainer's names and units, so
`grpo-replay plot`, compare and the report read a TRL run like a built-in one.

The row is made from TRL's log of the step (`ReplayGRPOTrainer` logs the replay split under the names of
`grpo_replay.metric_names`: replay/share, replay/count, fresh/ and replay/ abs_adv, clip_frac, ratio_mean,
replay/age_mean, buffer/size, ...). Keys TRL has no counterpart for (ratio_max, age_hist) are absent rather than
made up.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ... import metric_names as mn

# built-in name <- TRL's log key, same unit (means over the step's generated rollouts / update tokens)
RENAMED = {
    "reward": "reward",
    mn.ZERO_VARIANCE_SHARE: "frac_reward_zero_std",  # TRL's own share of zero-std groups, as the built-in counts
    "completion_len": "completions/mean_length",
    "loss": "loss",
    "kl": "kl",
    "grad_norm": "grad_norm",
    "lr": "learning_rate",
    mn.BUFFER_SIZE: mn.BUFFER_SIZE,
    "time/step_s": "step_time",
}
SHARED = (mn.REPLAY_SHARE, mn.REPLAY_AGE_MEAN, mn.REPLAY_AGE_MAX, mn.FRESH_ABS_ADV, mn.REPLAY_ABS_ADV,
          mn.FRESH_CLIP_FRAC, mn.REPLAY_CLIP_FRAC, mn.FRESH_RATIO_MEAN, mn.REPLAY_RATIO_MEAN,
          mn.REPLAY_DRIFT_DROPPED, mn.REPLAY_DRIFT_MEAN, mn.REPLAY_DRIFT_MAX, mn.BUFFER_EVICTED_DRIFT,
          mn.REPLAY_INSERTED, mn.BUFFER_EVICTED_AGE, mn.BUFFER_EVICTED_USES)
COUNTS = (mn.REPLAY_AGE_MAX, mn.REPLAY_DRIFT_DROPPED, mn.BUFFER_EVICTED_DRIFT, mn.REPLAY_INSERTED,
          mn.BUFFER_EVICTED_AGE, mn.BUFFER_EVICTED_USES)  # rows: logged by TRL as floats, written as integers


def metrics_row(logs: dict[str, Any], step: int, rollouts_per_step: int,
                reward_names: tuple[str, ...] = ()) -> Optional[dict[str, Any]]:
    """The metrics.jsonl row of optimizer step `step` from TRL's log of it; None for a log that is not a training
    step's (TRL's end-of-training summary). rollouts_per_step = prompts_per_step x group_size; reward_names:
    TrainConfig.reward_funcs, whose rewards/<name>/mean TRL logs under the built-in trainer's name."""
    if "reward" not in logs:
        return None
    logs = mn.canonical(logs)  # a log written by an older ReplayGRPOTrainer (a resumed run's) reads alike
    row: dict[str, Any] = {"step": step, "generated": step * rollouts_per_step}
    row.update({name: logs[key] for name, key in RENAMED.items() if key in logs})
    row.update({name: logs[name] for name in SHARED if name in logs})
    row.update({k: logs[k] for k in (mn.REWARD_FUNC_MEAN.format(name=n) for n in reward_names) if k in logs})
    if mn.REPLAY_COUNT in logs:
        # update rows: replay rows over their share; without replay, every generated row (TRL's update keeps the
        # zero-variance groups, at advantage 0, where the built-in trainer drops them)
        replay = int(round(logs[mn.REPLAY_COUNT]))
        share = logs.get(mn.REPLAY_SHARE, 0.0)
        rows = int(round(replay / share)) if replay and share else rollouts_per_step
        row.update({"update_rows": rows, mn.FRESH_COUNT: rows - replay, mn.REPLAY_COUNT: replay})
    for count in COUNTS:
        if count in row:
            row[count] = int(row[count])
    return row


def callback(run_dir: Path, rollouts_per_step: int, reward_names: tuple[str, ...] = ()):
    """A TrainerCallback appending `metrics_row` of every logged training step to run_dir/metrics.jsonl."""
    from transformers import TrainerCallback

    from ..rundir import RunDir

    run = RunDir(run_dir)

    class MetricsLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **_):
            row = metrics_row(logs or {}, state.global_step, rollouts_per_step, tuple(reward_names))
            if row is not None and state.is_world_process_zero:
                run.log_metrics(row)

    return MetricsLog()
