"""grpo-replay for verl 0.9.x (optional extra; its own environment, see docs/verl.md).

- `ReplayHook` (hook.py): fresh `DataProto` -> composed `DataProto`; needs only `verl.DataProto`.
- `ReplayRayPPOTrainer` (trainer.py): the legacy `RayPPOTrainer` with replay in `_update_actor` and the buffer
  saved in verl's checkpoint folder; needs `verl[verl-core]` (Ray).
- `ReplayPPOTrainerSync` / `ReplayPPOTrainerColocateAsync` / `ReplayPPOTrainerSeparateAsync` (trainer_v1.py,
  rows kept in TransferQueue by v1_store.py, launch checks in v1_checks.py): verl's v1 trainer
  (`trainer.use_v1=true`, verl's default) with replay in `_update_actor`.
- `ReplayTaskRunner` (runner.py, legacy) / `ReplayTaskRunnerV1` (runner_v1.py) and `main` (main.py):
  `run_ppo(config, task_runner_class=...)` with the Hydra config `replay_ppo_trainer` (verl's `ppo_trainer` + the
  `replay` group); `main` picks the runner from `trainer.use_v1`.

The trainer and runner are imported lazily so that the hook works with a bare `pip install verl`.
"""
from ._compat import INSTALL_HINT, VERL_VERSION
from .hook import ReplayHook, ReplayPlan, VerlReplaySettings, prompt_key, split_config, to_dataproto, to_rollout_batch

__all__ = [
    "INSTALL_HINT",
    "VERL_VERSION",
    "ReplayHook",
    "ReplayPlan",
    "VerlReplaySettings",
    "prompt_key",
    "split_config",
    "to_dataproto",
    "to_rollout_batch",
    "ReplayRayPPOTrainer",
    "ReplayTaskRunner",
    "ReplayTaskRunnerV1",
    "ReplayPPOTrainerSync",
    "ReplayPPOTrainerColocateAsync",
    "ReplayPPOTrainerSeparateAsync",
]


def __getattr__(name):
    if name == "ReplayRayPPOTrainer":
        from .trainer import ReplayRayPPOTrainer

        return ReplayRayPPOTrainer
    if name == "ReplayTaskRunner":
        from .runner import ReplayTaskRunner

        return ReplayTaskRunner
    if name == "ReplayTaskRunnerV1":
        from .runner_v1 import ReplayTaskRunnerV1

        return ReplayTaskRunnerV1
    if name in ("ReplayPPOTrainerSync", "ReplayPPOTrainerColocateAsync", "ReplayPPOTrainerSeparateAsync"):
        from . import trainer_v1

        return getattr(trainer_v1, name)
    raise AttributeError(name)
