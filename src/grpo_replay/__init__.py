"""grpo-replay: rollout-level, advantage-prioritized experience replay for GRPO.

Public core API (framework-agnostic): config and presets, the rollout batch, the buffer, priorities,
compositions, advantage estimators, the replay-aware PPO-clip loss, the session every trainer drives
(`ReplaySession`) and fresh-vs-replay metrics.
"""
from .advantage import ESTIMATORS, estimate, group_advantages, nonzero_variance_mask
from .buffer import BufferStateError, ReplayBuffer
from .composed import ComposedBatch
from .composition import COMPOSITIONS, compose_batch
from .config import PRESETS, ReplayConfig
from .loss import AGGREGATIONS, LossConfig, ppo_clip_loss
from .diagnostics import split_metrics
from .priority import PRIORITIES
from .rollout import RolloutBatch
from .session import ReplaySession
from .tally import Tally

__version__ = "0.1.0"
__all__ = [
    "AGGREGATIONS",
    "BufferStateError",
    "COMPOSITIONS",
    "ESTIMATORS",
    "ComposedBatch",
    "LossConfig",
    "PRESETS",
    "PRIORITIES",
    "ReplayBuffer",
    "ReplayConfig",
    "ReplaySession",
    "RolloutBatch",
    "Tally",
    "compose_batch",
    "estimate",
    "group_advantages",
    "nonzero_variance_mask",
    "ppo_clip_loss",
    "split_metrics",
]
