"""`TrainConfig.reward_funcs` / `reward_weights` for `--backend trl`: one TRL reward function per named function,
each scored through its own `RewardScorer` (reward_timeout; a call that raises or times out scores 0 and is
counted), named so that TRL logs it as rewards/<name>/mean; TRL sums them with `reward_weights` (its own
`sum_then_normalize`), as the built-in trainer's `WeightedReward` does."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..rewards import WeightedReward
from ..train_config import TrainConfig


def named_reward_funcs(weighted: WeightedReward,
                       adapt: Callable[[Callable[[Sequence[str], Sequence[Any]], tuple]], Callable[..., list[float]]],
                       ) -> list[Callable[..., list[float]]]:
    """TRL reward functions, one per term of `weighted` (`training_reward`) in its order, each named by it.
    `adapt(score)` turns a `score(texts, problems) -> (rewards, counts)` call into a function of TRL's signature."""
    funcs = []
    for name, _, scorer in weighted.terms:
        fn = adapt(scorer)
        fn.__name__ = name  # TRL's reward_func_names: the metric rewards/<name>/mean
        funcs.append(fn)
    return funcs


def reward_weights(cfg: TrainConfig) -> dict[str, Any]:
    """The `GRPOConfig` field of the weights: one per reward function, or none (TRL's default of 1 each)."""
    return {"reward_weights": list(cfg.reward_weights)} if cfg.reward_funcs and cfg.reward_weights else {}
