"""The verl launchers give every arm and seed its own seeds and checkpoint folder, and the entry point says whether a
launch resumes, refusing a folder another run wrote (verl's resume_mode=auto would load it)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("verl.protocol")

import gpu_commands as gc  # noqa: E402

ENTRY = "grpo_replay.integrations.verl.main"
SEEDS = ("actor_rollout_ref.rollout.seed", "data.seed", "actor_rollout_ref.actor.data_loader_seed", "replay.seed",
         "actor_rollout_ref.actor.fsdp_config.seed")


def _compose(overrides):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="grpo_replay.integrations.verl.config", version_base=None):
        return compose(config_name="replay_ppo_trainer", overrides=overrides)


def _launch(tmp, script, **env):
    argv = ["env", *(f"{k}={v}" for k, v in env.items()), "bash", script]
    (rec,) = [r for r in gc.run_with_env(argv, tmp, script) if r["cmd"] == "python"]
    return _compose(gc.strip_python_m(rec["argv"], ENTRY))


def _seeds(cfg) -> tuple:
    from omegaconf import OmegaConf

    return tuple(OmegaConf.select(cfg, k) for k in SEEDS)


@pytest.mark.parametrize("script", ["examples/verl/run_paper_single_node.sh", "examples/verl/run_paper_multi_node.sh"])
def test_each_arm_and_seed_gets_its_seeds_and_folder(tmp_path, script):
    runs = {(p, s): _launch(tmp_path / f"{p}-{s}", script, PRESET=p, SEED=s)
            for p in ("grpo", "paper") for s in (0, 1)}
    folders = {k: str(c.trainer.default_local_dir) for k, c in runs.items()}
    assert len(set(folders.values())) == len(runs), folders  # one checkpoint folder per arm and seed
    for (p, s), c in runs.items():
        assert _seeds(c) == (s,) * len(SEEDS), (p, s, _seeds(c))  # every seed of the run is SEED
        assert c.replay.preset == p
    assert _seeds(runs["grpo", 0]) != _seeds(runs["grpo", 1])  # seeds are distinct runs of one arm


def test_paper_table_seed_loop_varies_every_seed(tmp_path):
    recs = [r for r in gc.doc_commands(tmp_path) if r["source"].startswith("docs/paper_table.md")
            and r["cmd"] == "python" and gc.strip_python_m(r["argv"], ENTRY) is not None]
    cfgs = [_compose(gc.strip_python_m(r["argv"], ENTRY)) for r in recs]
    assert len(cfgs) == 12  # 4 arms x 3 seeds
    runs = {(c.replay.preset, _seeds(c)) for c in cfgs}
    assert len(runs) == 12 and {s for _, s in runs} == {(i,) * len(SEEDS) for i in range(3)}
    assert len({str(c.trainer.default_local_dir) for c in cfgs}) == 12


def test_entry_point_says_fresh_or_resume_and_refuses_another_runs_folder(tmp_path):
    from grpo_replay.integrations.verl.run_folder import LATEST, RECORD, check_run_folder

    folder = tmp_path / "ckpt"
    base = [f"trainer.default_local_dir={folder}", "replay=paper", "replay.seed=0", "data.seed=0"]
    assert "a fresh run" in check_run_folder(_compose(base))
    assert json.loads((folder / RECORD).read_text())["replay.preset"] == "paper"
    (folder / LATEST).write_text("20")  # what verl leaves after saving global_step_20
    assert "resumes global_step_20" in check_run_folder(_compose(base))
    other = [f"trainer.default_local_dir={folder}", "replay=grpo", "replay.seed=0", "data.seed=0"]
    with pytest.raises(ValueError, match=r"holds checkpoints \(global_step_20\) of another run \(replay.preset="
                                         r"'paper' there, 'grpo' here\)"):
        check_run_folder(_compose(other))
    with pytest.raises(ValueError, match=r"data.seed=0 there, 1 here"):
        check_run_folder(_compose([*base[:-1], "data.seed=1"]))
    assert json.loads((folder / RECORD).read_text())["replay.preset"] == "paper"  # a refusal writes nothing
    assert "resume_mode=disable" in check_run_folder(_compose([*other, "trainer.resume_mode=disable"]))
