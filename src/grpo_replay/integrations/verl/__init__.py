"""grpo-replay for verl 0.9.x (optional extra; its own environment, see docs/verl.md).

- `ReplayHook` (hook.py): fresh `DataProto` -> composed `DataProto`; needs only `verl.DataProto`.
- `ReplayRayPPOTrainer` (trainer.py): the legacy `RayPPOTrainer` with replay in `_update_actor` and the buffer
  saved in verl's checkpoint folder; needs `verl[verl-core]` (Ray).
- `ReplayTaskRunner` (runner.py) and `main` (main.py): `run_ppo(config, task_runner_class=ReplayTaskRunner)`
  with the Hydra config `replay_ppo_trainer` (verl's `ppo_trainer` + the `replay` group).

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
]


def __getattr__(name):
    if name == "ReplayRayPPOTrainer":
        from .trainer import ReplayRayPPOTrainer

        return ReplayRayPPOTrainer
    if name == "ReplayTaskRunner":
        from .runner import ReplayTaskRunner

        return ReplayTaskRunner
    raise AttributeError(name)
