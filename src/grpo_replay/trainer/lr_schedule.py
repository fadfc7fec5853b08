"""The learning-rate schedule of both backends, and what their `lr` column means.

Linear warm-up over `lr_warmup_steps` updates, then constant: update k (1-based) uses lr * min(1, k /
lr_warmup_steps), so the first update already learns (lr / lr_warmup_steps) and update lr_warmup_steps is the first
at the full rate. A metrics row's `lr` is the rate the step's update used. The built-in trainer's schedule advances
once per update it makes; `--backend trl` installs the same factor on TRL's scheduler (transformers' own warm-up,
step / warmup_steps, would make the first update at lr 0).
"""
from __future__ import annotations

from typing import Any, Callable


def warmup_factor(warmup_steps: int) -> Callable[[int], float]:
    """The LambdaLR factor of update s + 1 (s = updates made before it)."""
    return lambda s: min(1.0, (s + 1) / max(1, warmup_steps))


def install(scheduler: Any, warmup_steps: int) -> None:
    """Give a LambdaLR (or a wrapper holding one as `.scheduler`) the `warmup_factor`, and set its optimizer's rates
    to the factor at its current position (a resumed scheduler's included)."""
    sched = getattr(scheduler, "scheduler", scheduler)
    factor = warmup_factor(warmup_steps)
    sched.lr_lambdas = [factor] * len(sched.optimizer.param_groups)
    for group, base in zip(sched.optimizer.param_groups, sched.base_lrs):
        group["lr"] = base * factor(sched.last_epoch)
    sched._last_lr = [group["lr"] for group in sched.optimizer.param_groups]


def trl_callback(warmup_steps: int):
    """A TrainerCallback installing the schedule on TRL's constant scheduler when training begins (after a resumed
    scheduler's state is loaded)."""
    from transformers import TrainerCallback

    class WarmupSchedule(TrainerCallback):
        def on_train_begin(self, args, state, control, lr_scheduler=None, **_):
            install(lr_scheduler, warmup_steps)

    return WarmupSchedule()
