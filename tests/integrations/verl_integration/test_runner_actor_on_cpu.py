"""`ReplayTaskRunner` as a real Ray actor (local Ray, 1 CPU), the way `run_ppo` creates and calls it. CPU only.

An in-process instance cannot show actor-creation failures: the actor class and its bases are pickled to a worker
process, and a base pickled by value broke `super()` there. `run` gets a verl config whose model path
does not exist, so verl's unchanged `TaskRunner.run` proceeds inside the actor until it loads the model config.
"""
from __future__ import annotations

import os

import pytest

pytest.importorskip("verl.protocol")  # a real module: a folder named verl on sys.path must not count
ray = pytest.importorskip("ray")

from test_trainer_on_cpu import verl_config  # noqa: E402

MISSING_MODEL = "/nonexistent/grpo-replay-test-model"


@pytest.fixture(scope="module")
def local_ray():
    src = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "src"))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    yield
    ray.shutdown()


@pytest.mark.timeout(720)
def test_runner_starts_as_ray_actor_and_binds_the_replay_trainer(local_ray, tmp_path):
    from grpo_replay.integrations.verl.legacy.runner import ReplayTaskRunner

    cfg = verl_config(
        tmp_path,
        f"actor_rollout_ref.model.path={MISSING_MODEL}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=1",
    )
    runner = ReplayTaskRunner.remote()  # run_ppo's call; actor creation itself used to die here
    with pytest.raises(Exception) as err:  # noqa: PT011 - Ray wraps the actor's error in its own type
        ray.get(runner.run.remote(cfg), timeout=600)  # Ray + verl imports take minutes on a loaded 2-core machine
    assert not isinstance(err.value, ray.exceptions.ActorDiedError), err.value
    assert MISSING_MODEL in str(err.value)  # verl's run() got as far as loading the model config

    def probe(runner_self):  # a local function: pickled by value, runs inside the actor
        import verl.trainer.main_ppo_v0 as v0

        from grpo_replay.integrations.verl.legacy.runner import verl_task_runner_class

        def name(cls):
            return f"{cls.__module__}.{cls.__qualname__}"

        run_globals = verl_task_runner_class().run.__globals__
        return {"pid": os.getpid(), "bound": name(v0.RayPPOTrainer), "run_reads": name(run_globals["RayPPOTrainer"])}

    seen = ray.get(runner.__ray_call__.remote(probe), timeout=60)
    assert seen["pid"] != os.getpid()  # inside the actor process
    replay = "grpo_replay.integrations.verl.legacy.trainer.ReplayRayPPOTrainer"
    assert seen["bound"] == replay
    assert seen["run_reads"] == replay  # the global verl's TaskRunner.run constructs
    ray.kill(runner)
