"""`ReplayTaskRunner`: verl 0.9.1's legacy `main_ppo_v0.TaskRunner` building a `ReplayRayPPOTrainer`.

verl's `TaskRunner.run` constructs `RayPPOTrainer` by its module-global name; the runner, inside its own Ray actor
process, rebinds that one name and then calls verl's unchanged `TaskRunner.run`. Use it as
`verl.trainer.main_ppo.run_ppo(config, task_runner_class=ReplayTaskRunner)`.

Why not `class ReplayTaskRunnerImpl(TaskRunner.__ray_actor_class__)`: `main_ppo_v0.TaskRunner` is the Ray actor
class, so its plain class cannot be found by name and cloudpickle ships it to the actor by value: a copy whose
`super()` cell and module globals are not the real ones (actor creation died with `super(type, obj)`, and a
rebinding of `RayPPOTrainer` would not reach the copy's `run`). The runner therefore subclasses the importable
`BaseTaskRunner` (all the methods `run` calls live there) and calls the plain `TaskRunner.run` function taken from
the actor process's own import of `main_ppo_v0`, whose globals are that module's namespace.
"""
from __future__ import annotations

try:
    import ray
    import verl.trainer.main_ppo_v0 as _v0
except ImportError as e:  # pragma: no cover
    from .._compat import INSTALL_HINT

    raise ImportError(f"ReplayTaskRunner needs verl[verl-core] (Ray): {INSTALL_HINT} ({e})") from e

from .checks import check_config
from .trainer import ReplayRayPPOTrainer


def verl_task_runner_class() -> type:
    """verl's plain (undecorated) legacy `TaskRunner` class of this process."""
    return getattr(_v0.TaskRunner, "__ray_actor_class__", _v0.TaskRunner)


class ReplayTaskRunnerImpl(_v0.BaseTaskRunner):
    """Plain class (testable without Ray); `ReplayTaskRunner` is its Ray actor."""

    trainer_cls = ReplayRayPPOTrainer

    def run(self, config):
        if config.trainer.get("use_v1", False):
            raise ValueError(
                "ReplayTaskRunner runs the legacy RayPPOTrainer (trainer.use_v1=false); use ReplayTaskRunnerV1 for v1"
            )
        check_config(config)  # what replay cannot run fails here too, for a programmatic launch
        _v0.RayPPOTrainer = self.trainer_cls  # the name verl's run() reads; this actor's process only
        return verl_task_runner_class().run(self, config)


ReplayTaskRunner = ray.remote(ReplayTaskRunnerImpl)
