"""CPU twins of the verl recipes: examples/verl/run_paper_single_node.sh and run_paper_multi_node.sh are run (their
`python -m grpo_replay.integrations.verl.main` recorded, tests/gpu_commands.py), and their overrides, with the toy
sizes a user would pass through the launchers' own variables (PROMPTS, N_GPUS, NNODES, DATA, CKPT_ROOT/CKPT_DIR)
and a few Hydra overrides after them, run through verl's real v1 `fit()` with the fakes of v1_driver.py for the GPU
parts. Each checks the realised replay share, the run's seeds, and its own fresh checkpoint folder, which the
entry point's run-folder check then reports as resumable and refuses to another arm."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("verl.protocol")
ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

import gpu_commands as gc  # noqa: E402
from v1_driver import run_fit, write_dataset  # noqa: E402
from v1_setup import empty_tq, replay_cls, tq_cluster  # noqa: E402,F401

ENTRY = "grpo_replay.integrations.verl.main"
SEED_KEYS = ("replay.seed", "data.seed", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.actor.data_loader_seed")
# Only what the launchers take no variable for: prompt/response lengths, steps, checkpoint and validation cadence.
TOY = ["data.max_prompt_length=32", "data.max_response_length=6", "data.dataloader_num_workers=0",
       "trainer.total_training_steps=3", "trainer.save_freq=3", "trainer.test_freq=-1",
       "trainer.val_before_train=false", "replay.warmup_steps=0",
       "transfer_queue.backend.SimpleStorage.num_data_storage_units=2"]


def _launch(tmp_path, script, ckpt_var, preset="paper", seed=1):
    data = tmp_path / "data"
    data.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        if not (data / f"{split}.parquet").exists():
            write_dataset(str(data / f"{split}.parquet"))
    env = {"PRESET": preset, "SEED": str(seed), "PROMPTS": "4", "N_GPUS": "2", "NNODES": "1", "MODEL": "/nonexistent",
           "DATA": str(data), ckpt_var: str(tmp_path / "ckpt")}
    argv = ["env", *(f"{k}={v}" for k, v in env.items()), "bash", script, *TOY]
    (rec,) = [r for r in gc.run_with_env(argv, tmp_path / "launch", script) if r["cmd"] == "python"]
    overrides = gc.strip_python_m(rec["argv"], ENTRY)
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="grpo_replay.integrations.verl.config", version_base=None):
        cfg = compose(config_name="replay_ppo_trainer", overrides=overrides)
    cfg.transfer_queue.enable = True
    return cfg


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script,ckpt_var", [("examples/verl/run_paper_single_node.sh", "CKPT_ROOT"),
                                             ("examples/verl/run_paper_multi_node.sh", "CKPT_DIR")])
def test_launcher_twin_replays_its_share_into_its_own_folder(tq_cluster, tmp_path, script, ckpt_var):
    from omegaconf import OmegaConf

    from grpo_replay.integrations.verl.run_folder import check_run_folder

    cfg = _launch(tmp_path, script, ckpt_var)
    folder = tmp_path / "ckpt" / str(cfg.trainer.experiment_name)
    assert str(cfg.trainer.default_local_dir) == str(folder) and not folder.exists()
    assert [OmegaConf.select(cfg, k) for k in SEED_KEYS] == [1] * len(SEED_KEYS)
    # the launcher's batch mapping: one optimizer step per batch of PROMPTS x 8 rollouts
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == cfg.data.train_batch_size == 4
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.replay.preset == "paper"
    assert "a fresh run" in check_run_folder(cfg)
    empty_tq()
    t = run_fit(replay_cls(cfg.trainer.v1.trainer_mode), cfg)
    shares = {s: m["replay/share"] for s, m in t.step_metrics.items()}
    target = cfg.replay.replay_ratio / (1 + cfg.replay.replay_ratio)
    # the tally's share divides in float32, as every trainer's: within 1e-6 of the ratio of row counts
    assert any(abs(v - target) < 1e-6 for v in shares.values()) and max(shares.values()) <= target + 1e-6, shares
    assert (folder / "global_step_3").is_dir()  # verl's checkpoint, in this run's own folder
    assert "resumes global_step_3" in check_run_folder(cfg)  # a rerun of this run continues it
    other = _launch(tmp_path / "other", script, ckpt_var, preset="grpo")
    other.trainer.default_local_dir = str(folder)  # another arm pointed at this run's folder
    with pytest.raises(ValueError, match="another run"):
        check_run_folder(other, write=False)
