"""`ReplayTaskRunnerV1` and the entry point's choice of runner, on CPU.

The actor test runs verl's unchanged `TaskRunnerV1.run` inside a real Ray actor (as `run_ppo` does) with a model path
that does not exist: `run` initialises TransferQueue, builds the trainer class the runner selected and fails only when
the trainer loads the model config. The entry point's bad-input checks run as a subprocess (exit status 2).
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
import sys

import pytest

pytest.importorskip("verl.protocol")
ray = pytest.importorskip("ray")

from omegaconf import OmegaConf  # noqa: E402

MISSING_MODEL = "/nonexistent/grpo-replay-test-model"
SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "src"))


def test_v1_runner_binds_the_replay_trainer_and_refuses_what_it_cannot_run(monkeypatch):
    import verl.trainer.ppo.v1 as v1
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from grpo_replay.integrations.verl.runner_v1 import ReplayTaskRunnerV1, ReplayTaskRunnerV1Impl, verl_v1_runner_class
    from grpo_replay.integrations.verl.trainer_v1 import ReplayPPOTrainerSync

    seen = {}
    monkeypatch.setattr(v1, "get_trainer_cls", v1.get_trainer_cls)  # restored after the test
    monkeypatch.setattr(verl_v1_runner_class(), "run",
                        lambda self, config: seen.setdefault("cls", v1.get_trainer_cls(config.trainer.v1.trainer_mode)))
    runner = ReplayTaskRunnerV1Impl()
    runner.run(OmegaConf.create({"trainer": {"use_v1": True, "v1": {"trainer_mode": "sync"}}}))
    assert seen["cls"] is ReplayPPOTrainerSync
    assert TRAINER_REGISTRY["sync"] is not ReplayPPOTrainerSync  # verl's registry is untouched
    with pytest.raises(ValueError, match="use_v1"):
        runner.run(OmegaConf.create({"trainer": {"use_v1": False}}))
    with pytest.raises(ValueError, match=r"trainer\.v1\.trainer_mode='bogus' is not a verl trainer; allowed"):
        runner.run(OmegaConf.create({"trainer": {"use_v1": True, "v1": {"trainer_mode": "bogus"}}}))
    assert hasattr(ReplayTaskRunnerV1, "remote")


def test_package_exports_every_v1_trainer_class():
    import grpo_replay.integrations.verl as pkg
    from grpo_replay.integrations.verl.trainer_v1 import REPLAY_CLASSES

    assert {getattr(pkg, name) for name in pkg.__all__ if name.startswith("ReplayPPOTrainer")} == set(
        REPLAY_CLASSES.values())
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None


def _main(*overrides):
    if not any(o.startswith("algorithm.adv_estimator=") for o in overrides):
        overrides = ("algorithm.adv_estimator=grpo", *overrides)  # verl's default, gae, is refused
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    # A temporary working directory: Hydra writes its outputs/ folder there, not into the checkout.
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([sys.executable, "-m", "grpo_replay.integrations.verl.main", *overrides],
                              capture_output=True, text=True, env=env, timeout=300, cwd=cwd)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "override,message",
    [
        ("trainer.v1.trainer_mode=bogus", "trainer.v1.trainer_mode='bogus' is not a verl trainer; allowed"),
        ("replay.priority=bogus", "priority"),
        ("transfer_queue.backend.SimpleStorage.total_storage_size=100",
         "transfer_queue.backend.SimpleStorage.total_storage_size=100 cannot hold"),
        # stored rows live in the row store: only an update's replay rows (no age bound here) take room in it
        ("transfer_queue.backend.SimpleStorage.total_storage_size=100 replay.tau_max=null replay.capacity=null",
         "replay rows of an update (replay.replay_ratio * train_batch_size * rollout.n) plus"),
    ],
)
def test_main_refuses_bad_settings_with_exit_2_before_ray(override, message):
    r = _main(*override.split(), f"actor_rollout_ref.model.path={MISSING_MODEL}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert message in r.stderr and "ray init" not in r.stdout


@pytest.fixture()
def launch_paths(tmp_path):
    """An existing model folder and data file, so that the checks after the path checks are reached."""
    (tmp_path / "model").mkdir()
    (tmp_path / "train.parquet").write_bytes(b"")
    return [f"actor_rollout_ref.model.path={tmp_path / 'model'}", f"data.train_files=[{tmp_path / 'train.parquet'}]",
            f"data.val_files=[{tmp_path / 'train.parquet'}]"]


def _compose(*overrides):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="grpo_replay.integrations.verl.config", version_base=None):
        return compose(config_name="replay_ppo_trainer", overrides=list(overrides))


@pytest.mark.parametrize(
    "override,message",
    [
        ("algorithm.adv_estimator=gae", "algorithm.adv_estimator='gae': replay stores one advantage per rollout"),
        ("critic.enable=true", "critic.enable=true: replay stores one advantage per rollout"),
        ("actor_rollout_ref.actor.use_prefix_grouper=true",
         "actor_rollout_ref.actor.use_prefix_grouper=true: verl's v1 trainer does not use the prefix grouper"),
        ("trainer.v1.trainer_mode=colocate_async trainer.v1.sampler.max_off_policy_threshold=1",
         "max_off_policy_threshold=1 lets a trajectory span one version only"),
        ("transfer_queue.backend.SimpleStorage.num_data_storage_units=8 ray_kwargs.ray_init.num_cpus=2",
         "num_data_storage_units=8: TransferQueue asks Ray for 9 CPUs"),
        ("actor_rollout_ref.model.path=/nonexistent/model",
         "actor_rollout_ref.model.path: /nonexistent/model does not exist"),
        ("data.train_files=[/nonexistent/train.parquet]", "data.train_files: /nonexistent/train.parquet does not exist"),
    ],
)
def test_entry_point_checks_refuse_what_cannot_run(launch_paths, override, message):
    """`main.check_config` and `main.check_environment` (what the entry point runs before Ray) on verl's composed
    config; the exit status 2 of the entry point itself is tested above and for the resource shortfall below."""
    from grpo_replay.integrations.verl.main import check_config, check_environment

    extra = override.split()
    base = [o for o in ["algorithm.adv_estimator=grpo", *launch_paths] if o.split("=")[0] not in
            {e.split("=")[0] for e in extra}]
    cfg = _compose(*base, *extra)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_config(cfg)
        check_environment(cfg)


def test_entry_point_says_the_replay_age_bound(launch_paths):
    from grpo_replay.integrations.verl.main import check_config, check_environment
    from grpo_replay.integrations.verl.runner_v1 import ReplayTaskRunnerV1

    cfg = _compose("algorithm.adv_estimator=grpo", *launch_paths, "trainer.v1.trainer_mode=colocate_async",
                   "transfer_queue.backend.SimpleStorage.num_data_storage_units=1", "ray_kwargs.ray_init.num_cpus=2")
    assert check_config(cfg) is ReplayTaskRunnerV1
    assert ("replay age bound: 7 versions = min(replay.tau_max=10, trainer.v1.sampler.max_off_policy_threshold - 1 "
            "= 7) in colocate_async") in check_environment(cfg)


@pytest.mark.timeout(600)
def test_main_turns_a_resource_shortfall_into_exit_2(launch_paths):
    """verl's default of 8 storage units on a 2-CPU Ray would wait forever in tq.init."""
    r = _main(*launch_paths, "transfer_queue.backend.SimpleStorage.num_data_storage_units=8",
              "ray_kwargs.ray_init.num_cpus=2")
    assert r.returncode == 2, r.stderr[-2000:]
    assert ("num_data_storage_units=8: TransferQueue asks Ray for 9 CPUs (one per storage unit and one for its "
            "controller) but the local Ray cluster run_ppo starts has 2 free") in r.stderr
    assert "ray init" not in r.stdout


@pytest.fixture(scope="module")
def local_ray():
    env = {"PYTHONPATH": os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    yield
    ray.shutdown()


@pytest.mark.timeout(900)
def test_v1_runner_starts_as_ray_actor_and_builds_the_replay_trainer(local_ray, tmp_path):
    from hydra import compose, initialize_config_module

    from grpo_replay.integrations.verl.runner_v1 import ReplayTaskRunnerV1

    with initialize_config_module(config_module="grpo_replay.integrations.verl.config", version_base=None):
        cfg = compose(config_name="replay_ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={MISSING_MODEL}", "actor_rollout_ref.rollout.n=4",
            "data.train_batch_size=8", "algorithm.adv_estimator=grpo", f"trainer.default_local_dir={tmp_path}",
            "transfer_queue.backend.SimpleStorage.num_data_storage_units=2",  # verl's 8 hang tq.init on 2 cores
        ])
    assert cfg.trainer.use_v1 is True  # verl's default, kept by the replay config
    runner = ReplayTaskRunnerV1.remote()
    with pytest.raises(Exception) as err:  # noqa: PT011 - Ray wraps the actor's error in its own type
        ray.get(runner.run.remote(cfg), timeout=600)
    assert not isinstance(err.value, ray.exceptions.ActorDiedError), err.value
    assert MISSING_MODEL in str(err.value)

    def probe(runner_self):  # runs inside the actor
        import verl.trainer.ppo.v1 as v1

        t = type(runner_self.trainer)
        return {"pid": os.getpid(), "trainer": f"{t.__module__}.{t.__qualname__}",
                "get_trainer_cls": v1.get_trainer_cls.__module__}

    # inside the cluster: TransferQueue's placement group must fit the cluster's free CPUs, before tq.init
    many = cfg.copy()
    many.transfer_queue.backend.SimpleStorage.num_data_storage_units = 16
    with pytest.raises(Exception, match="num_data_storage_units=16: TransferQueue asks Ray for 17 CPUs"):  # noqa: PT011
        ray.get(ReplayTaskRunnerV1.remote().run.remote(many), timeout=120)

    seen = ray.get(runner.__ray_call__.remote(probe), timeout=60)
    assert seen["pid"] != os.getpid()
    assert seen["trainer"] == "grpo_replay.integrations.verl.trainer_v1.ReplayPPOTrainerSync"
    assert seen["get_trainer_cls"] == "grpo_replay.integrations.verl.trainer_v1"
    ray.kill(runner)
