"""The step plan of a `ReplayGRPOTrainer` under TRL's split, known at construction.

TRL splits each process's generation (per_device_train_batch_size x steps_per_generation fresh rows) into
steps_per_generation micro-batches. The trainer composes through `ReplaySession.compose` with that unit, so the
replay count is the one the split holds nearest to the ratio (`step_plan`): 6 fresh + 3 replay rows planned in 2
micro-batches train 6 + 2. Only a mapping under which no replay row would train (one fresh row per process at ratio
0.5 rounds to none; one-row micro-batches hold none nearer the ratio) is refused, before anything is trained, with the batch settings under which replay trains.
"""
from __future__ import annotations

import warnings

from ...config import ReplayConfig
from ...errors import ConfigError
from ...step_plan import StepPlan, plan_step


def check_share(args, cfg: ReplayConfig, num_processes: int) -> StepPlan:
    """The `StepPlan` of one process's step (a full buffer after warm-up); ConfigError naming the fields and the
    settings under which replay trains, where it would train no replay row."""
    spg = int(args.steps_per_generation)
    fresh = int(args.generation_batch_size) // num_processes
    group = int(getattr(args, "num_generations", None) or 1)
    plan = plan_step(fresh, cfg, spg, group_size=group)
    if cfg.fill_filtered and spg > 1:
        warnings.warn(f"ReplayGRPOTrainer: with replay_fill_filtered the replay rows per generation vary; they are "
                      f"fitted to steps_per_generation={spg} micro-batches per process at each step")
    elif plan.vanishes:
        ok = [u for u in range(1, fresh + 1) if fresh % u == 0
              and plan_step(fresh, cfg, u, group_size=group).realised]
        fixes = ", ".join(f"per_device_train_batch_size={fresh // u} with steps_per_generation={u}" for u in ok[:3])
        raise ConfigError(
            f"ReplayGRPOTrainer: per_device_train_batch_size={args.per_device_train_batch_size} x "
            f"steps_per_generation={spg} = {fresh} fresh rows per process with replay_ratio={cfg.replay_ratio} "
            f"({cfg.composition}) would train no replay row ({plan.planned} planned, {plan.replay} after the split "
            f"into {spg} micro-batches): the replay arm would be GRPO; allowed: "
            + (fixes or "more fresh rows per process") + " (gradient_accumulation_steps = steps_per_generation keeps "
            "one optimizer step per generation), or a larger replay_ratio")
    return plan
