"""TRL integration: `ReplayGRPOTrainer` and `ReplayGRPOConfig`, drop-in replacements for TRL's GRPO ones, and
`ReplayAsyncGRPOTrainer` / `ReplayAsyncGRPOConfig` for TRL's experimental `AsyncGRPOTrainer` (imported on first use).

    from grpo_replay.integrations.trl import ReplayGRPOTrainer, ReplayGRPOConfig

    args = ReplayGRPOConfig(output_dir="out", replay_preset="paper", replay_tau_max=10, ...)
    trainer = ReplayGRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=..., processing_class=...)
    trainer.train()

Supported TRL: 1.16.x (checked at import; set GRPO_REPLAY_ALLOW_UNSUPPORTED_TRL=1 to try another version at
your own risk: the trainer hooks TRL internals whose names and shapes change between minor versions).
"""
from __future__ import annotations

import os
import warnings

SUPPORTED_TRL = ((1, 16),)  # (major, minor) release lines this integration was written and tested against
SUPPORTED_TRL_TEXT = "trl>=1.16.0,<1.17"


def _check_trl_version() -> str:
    try:
        import trl
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"grpo_replay.integrations.trl needs TRL ({SUPPORTED_TRL_TEXT}); install it with "
            f"`pip install -e '.[trl]'` in a grpo-replay checkout or `pip install '{SUPPORTED_TRL_TEXT}'`"
        ) from e
    from packaging.version import Version

    version = Version(trl.__version__)
    if tuple(version.release[:2]) not in SUPPORTED_TRL:
        msg = (
            f"grpo_replay.integrations.trl supports {SUPPORTED_TRL_TEXT}, found trl=={trl.__version__}. "
            "ReplayGRPOTrainer hooks GRPOTrainer internals (_generate_and_score_completions, _calculate_rewards, "
            "_compute_loss) that change between TRL minor versions. Install a supported version, or set "
            "GRPO_REPLAY_ALLOW_UNSUPPORTED_TRL=1 to proceed at your own risk."
        )
        if os.environ.get("GRPO_REPLAY_ALLOW_UNSUPPORTED_TRL") == "1":
            warnings.warn(msg, stacklevel=3)
        else:
            raise ImportError(msg)
    return trl.__version__


TRL_VERSION = _check_trl_version()

from .replay_grpo_config import ReplayGRPOConfig  # noqa: E402
from .replay_grpo_trainer import ReplayGRPOTrainer  # noqa: E402


_ASYNC = {"ReplayAsyncGRPOConfig": ".replay_async_config", "ReplayAsyncGRPOTrainer": ".replay_async_trainer"}


def __getattr__(name: str):
    # trl.experimental.async_grpo takes seconds to import: only for those who use it.
    if name in _ASYNC:
        import importlib

        return getattr(importlib.import_module(_ASYNC[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ReplayAsyncGRPOConfig", "ReplayAsyncGRPOTrainer", "ReplayGRPOConfig", "ReplayGRPOTrainer",
           "SUPPORTED_TRL_TEXT", "TRL_VERSION"]
