"""grpo-replay for verl 0.9.x (optional extra; its own environment, see docs/verl.md).

The trainer to use is verl's v1 trainer (`trainer.use_v1=true`, verl's default), in this folder:
- `ReplayPPOTrainerSync` / `ReplayPPOTrainerColocateAsync` / `ReplayPPOTrainerSeparateAsync` (trainer_v1.py):
  replay in `_update_actor`. The buffer (payload-free: the scalars it samples on) is in the trainer; the stored
  rows live outside TransferQueue, in a `RowStore` Ray actor of their own (row_store.py, through v1_store.py), and
  a replayed row is put into TransferQueue only for the update that reads it; launch checks in v1_checks.py;
- `ReplayTaskRunnerV1` (runner_v1.py) and `main` (main.py): `run_ppo(config, task_runner_class=...)` with the
  Hydra config `replay_ppo_trainer` (verl's `ppo_trainer` + the `replay` group); `main` picks the runner from
  `trainer.use_v1`.

Shared by both trainers: settings.py (the `replay` group, resolved once per trainer: `resolve_replay`), sizing.py
(the row counts verl's worker accepts and the one mini-batch rule, `scaled_mini_batch`), checkpoints.py (one save,
load and prune of the replay state in verl's checkpoint folders). The prompt key and per-row advantage both read
off a fresh row are the core's (`grpo_replay.adapter_rows`).

The older path, verl's legacy `RayPPOTrainer` (`trainer.use_v1=false`, deprecated by verl and still shipped), is in
legacy/: `ReplayRayPPOTrainer`, `ReplayTaskRunner` and `ReplayHook` (fresh `DataProto` -> composed `DataProto`;
needs only `verl.DataProto`; its buffer holds the whole rows).

The trainers and runners are imported lazily (they need the `verl-core` extra: Ray, TransferQueue), so that the
settings and the legacy hook import with a bare `pip install verl`.
"""
from ._compat import INSTALL_HINT, VERL_VERSION
from ...adapter_rows import prompt_key
from .settings import VerlReplaySettings, split_config
from .legacy.hook import ReplayHook, ReplayPlan, to_dataproto, to_rollout_batch

_V1_TRAINERS = ("ReplayPPOTrainerSync", "ReplayPPOTrainerColocateAsync", "ReplayPPOTrainerSeparateAsync")

__all__ = [
    # verl's v1 trainer
    *_V1_TRAINERS,
    "ReplayTaskRunnerV1",
    # shared by both trainers
    "VerlReplaySettings",
    "split_config",
    "prompt_key",
    "INSTALL_HINT",
    "VERL_VERSION",
    # verl's legacy RayPPOTrainer
    "ReplayRayPPOTrainer",
    "ReplayTaskRunner",
    "ReplayHook",
    "ReplayPlan",
    "to_dataproto",
    "to_rollout_batch",
]


def __getattr__(name):
    if name in _V1_TRAINERS:
        from . import trainer_v1

        return getattr(trainer_v1, name)
    if name == "ReplayTaskRunnerV1":
        from .runner_v1 import ReplayTaskRunnerV1

        return ReplayTaskRunnerV1
    if name == "ReplayRayPPOTrainer":
        from .legacy.trainer import ReplayRayPPOTrainer

        return ReplayRayPPOTrainer
    if name == "ReplayTaskRunner":
        from .legacy.runner import ReplayTaskRunner

        return ReplayTaskRunner
    raise AttributeError(name)
