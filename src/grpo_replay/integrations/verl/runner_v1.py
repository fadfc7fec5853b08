"""`ReplayTaskRunnerV1`: verl 0.9.1's `main_ppo.TaskRunnerV1` building the replay class for the v1 trainer mode.

verl's `TaskRunnerV1.run` picks its trainer with `from verl.trainer.ppo.v1 import get_trainer_cls` at call time.
The runner, inside its own Ray actor process, rebinds that one module attribute to `replay_trainer_cls` and then
calls verl's unchanged `run`. Not `register_trainer`: verl refuses a second class under "sync", and a new mode name
is treated as async in several places of v1. As with the legacy runner (legacy/runner.py), the plain `run` function is
taken from the actor process's own import of `main_ppo` and the class is an importable plain class wrapped with
`ray.remote` here (a subclass of verl's actor class would be pickled by value).
"""
from __future__ import annotations

try:
    import ray
    import verl.trainer.main_ppo as _main_ppo
    import verl.trainer.ppo.v1 as _v1
except ImportError as e:  # pragma: no cover
    from ._compat import INSTALL_HINT

    raise ImportError(f"ReplayTaskRunnerV1 needs verl[verl-core] (Ray): {INSTALL_HINT} ({e})") from e

from .trainer_v1 import replay_trainer_cls
from .v1_checks import check_config, check_resources


def verl_v1_runner_class() -> type:
    """verl's plain (undecorated) `TaskRunnerV1` class of this process."""
    return getattr(_main_ppo.TaskRunnerV1, "__ray_actor_class__", _main_ppo.TaskRunnerV1)


class ReplayTaskRunnerV1Impl:
    """Plain class (testable without Ray); `ReplayTaskRunnerV1` is its Ray actor."""

    def __init__(self):
        self.config = None
        self.trainer = None
        self.agent_loop_manager = None

    def init_agent_loop_manager(self):
        return verl_v1_runner_class().init_agent_loop_manager(self)

    def run(self, config):
        if not config.trainer.get("use_v1", True):
            raise ValueError("ReplayTaskRunnerV1 runs verl's v1 trainer: use ReplayTaskRunner for trainer.use_v1=false")
        # what replay cannot run fails here, before tq.init (which waits silently for CPUs the cluster lacks)
        replay_trainer_cls(config.trainer.v1.trainer_mode)
        check_config(config)
        free = ray.available_resources().get("CPU", 0.0) if ray.is_initialized() else None
        check_resources(config, free, "the Ray cluster")
        _v1.get_trainer_cls = replay_trainer_cls  # the name verl's run() imports; this actor's process only
        return verl_v1_runner_class().run(self, config)


ReplayTaskRunnerV1 = ray.remote(ReplayTaskRunnerV1Impl)
