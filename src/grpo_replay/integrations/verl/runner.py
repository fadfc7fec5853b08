"""`ReplayTaskRunner`: verl 0.9.1's legacy `main_ppo_v0.TaskRunner` building a `ReplayRayPPOTrainer`.

verl's `TaskRunner.run` constructs `RayPPOTrainer` by its module-global name; the runner subclasses the plain
(undecorated) runner class and, inside its own Ray actor process, rebinds that one name before calling the
unchanged `run`. Use it as `verl.trainer.main_ppo.run_ppo(config, task_runner_class=ReplayTaskRunner)`.
"""
from __future__ import annotations

try:
    import ray
    import verl.trainer.main_ppo_v0 as _v0
except ImportError as e:  # pragma: no cover
    from ._compat import INSTALL_HINT

    raise ImportError(f"ReplayTaskRunner needs verl[verl-core] (Ray): {INSTALL_HINT} ({e})") from e

from .trainer import ReplayRayPPOTrainer

_BaseRunner = getattr(_v0.TaskRunner, "__ray_actor_class__", _v0.TaskRunner)


class ReplayTaskRunnerImpl(_BaseRunner):
    """Plain class (testable without Ray); `ReplayTaskRunner` is its Ray actor."""

    trainer_cls = ReplayRayPPOTrainer

    def run(self, config):
        if config.trainer.get("use_v1", False):
            raise ValueError("grpo-replay hooks the legacy RayPPOTrainer: set trainer.use_v1=false")
        _v0.RayPPOTrainer = self.trainer_cls  # this actor's process only
        return super().run(config)


ReplayTaskRunner = ray.remote(ReplayTaskRunnerImpl)
