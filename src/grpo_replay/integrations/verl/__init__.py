"""grpo-replay for verl 0.9.x (optional extra; its own environment, see docs/verl.md).

verl's v1 trainer (`trainer.use_v1=true`, verl's default), in this folder:
- `ReplayPPOTrainerSync` / `ReplayPPOTrainerColocateAsync` / `ReplayPPOTrainerSeparateAsync` (trainer_v1.py):
  replay in `_update_actor`; rows kept in TransferQueue by v1_store.py, launch checks in v1_checks.py;
- `ReplayTaskRunnerV1` (runner_v1.py) and `main` (main.py): `run_ppo(config, task_runner_class=...)` with the
  Hydra config `replay_ppo_trainer` (verl's `ppo_trainer` + the `replay` group); `main` picks the runner from
  `trainer.use_v1`.

verl's legacy `RayPPOTrainer` (`trainer.use_v1=false`, deprecated by verl and still shipped), in legacy/:
`ReplayHook` (fresh `DataProto` -> composed `DataProto`; needs only `verl.DataProto`), `ReplayRayPPOTrainer` and
`ReplayTaskRunner`.

Shared by both: settings.py (the `replay` group), sizing.py (the row counts verl's worker accepts), rows.py (the
prompt key and per-row advantage), checkpoints.py (the buffer in verl's checkpoint folders).

The trainers and runners are imported lazily so that the hook works with a bare `pip install verl`.
"""
from ._compat import INSTALL_HINT, VERL_VERSION
from .legacy.hook import ReplayHook, ReplayPlan, to_dataproto, to_rollout_batch
from .rows import prompt_key
from .settings import VerlReplaySettings, split_config

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
        from .legacy.trainer import ReplayRayPPOTrainer

        return ReplayRayPPOTrainer
    if name == "ReplayTaskRunner":
        from .legacy.runner import ReplayTaskRunner

        return ReplayTaskRunner
    if name == "ReplayTaskRunnerV1":
        from .runner_v1 import ReplayTaskRunnerV1

        return ReplayTaskRunnerV1
    if name in ("ReplayPPOTrainerSync", "ReplayPPOTrainerColocateAsync", "ReplayPPOTrainerSeparateAsync"):
        from . import trainer_v1

        return getattr(trainer_v1, name)
    raise AttributeError(name)
