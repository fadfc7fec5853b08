"""The named reward functions of each task (`TrainConfig.reward_funcs`): what a weighted training reward is
made of. `correct` is the task's own verifiable reward, the one the held-out evaluation scores."""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

TASK_REWARD_FUNCS: dict[str, tuple[str, ...]] = {
    "testbed": ("correct", "digits", "format"),
    "math": ("correct",),
}

RewardFn = Callable[[str, Any], float]


def reward_functions(reward: str, task: Any) -> dict[str, RewardFn]:
    """name -> fn(completion_text, problem) for every function `TASK_REWARD_FUNCS[reward]` names."""
    funcs: dict[str, RewardFn] = {"correct": task.reward}
    if reward == "testbed":
        from .testbed.graded import digit_credit, format_credit

        eos = bool(task.cfg.require_eos)
        funcs["digits"] = partial(digit_credit, require_eos=eos)
        funcs["format"] = partial(format_credit, require_eos=eos)
    return {name: funcs[name] for name in TASK_REWARD_FUNCS[reward]}
