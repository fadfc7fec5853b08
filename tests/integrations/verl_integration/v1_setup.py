"""Shared set-up of the v1 `fit()` tests: one Ray cluster and TransferQueue per test module, the composed Hydra
config of a 6-step CPU run per trainer mode, and helpers to read what the fake actor trained on."""
from __future__ import annotations

import os

import pytest
import ray
import transfer_queue as tq
from hydra import compose, initialize_config_module
from v1_driver import write_dataset

ROLLOUT_N, PROMPTS, TAU = 4, 4, 2
RATIO = ("replay.replay_ratio=0.5",)


@pytest.fixture(scope="module")
def tq_cluster():
    src = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "src"))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    from omegaconf import OmegaConf

    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 2}}}))
    yield
    tq.close()
    ray.shutdown()


def empty_tq():
    for pid, items in (tq.kv_list() or {}).items():
        if items:
            tq.kv_clear(keys=list(items), partition_id=pid)


def v1_config(tmp_path, mode, *overrides):
    os.makedirs(tmp_path, exist_ok=True)
    data = str(tmp_path / "data.parquet")
    if not os.path.exists(data):
        write_dataset(data)
    with initialize_config_module(config_module="grpo_replay.integrations.verl.config", version_base=None):
        cfg = compose(
            config_name="replay_ppo_trainer",
            overrides=[
                f"data.train_files=[{data}]", f"data.val_files=[{data}]", f"data.train_batch_size={PROMPTS}",
                "data.max_prompt_length=32", "data.max_response_length=6", "data.dataloader_num_workers=0",
                f"actor_rollout_ref.rollout.n={ROLLOUT_N}", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.model.path=/nonexistent",
                "algorithm.adv_estimator=grpo", "trainer.total_training_steps=6", "trainer.save_freq=3",
                "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[console]",
                f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.resume_mode=disable",
                "trainer.n_gpus_per_node=2",
                "replay.warmup_steps=0", f"replay.tau_max={TAU}", f"trainer.v1.trainer_mode={mode}",
                *(SEPARATE if mode == "separate_async" else []),
                *overrides,
            ],
        )
    cfg.transfer_queue.enable = True
    return cfg


def replay_cls(mode):
    from grpo_replay.integrations.verl.trainer_v1 import replay_trainer_cls

    return replay_trainer_cls(mode)


MODES = ["sync", "colocate_async", "separate_async"]
# per mode: fresh rows per actor update, optimizer steps per update (K), replay rows per update once warm
SHAPE = {"sync": (16, 2, 8), "colocate_async": (16, 2, 8), "separate_async": (8, 1, 4)}
SEPARATE = [  # train_batch_size = parameter_sync_step * ppo_mini_batch_size; standalone rollout only
    "trainer.v1.separate_async.parameter_sync_step=2", "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]


def by_step(trainer):
    """{global step: [its actor updates]} (separate_async: parameter_sync_step updates per step)."""
    out = {}
    for u in trainer.actor_rollout_wg.updates:
        out.setdefault(u["step"], []).append(u)
    return out
