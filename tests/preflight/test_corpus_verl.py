"""A corpus of verl launches through `grpo-replay preflight`, in the verl environment (`scripts/test_verl.sh`):
plausible bad launches of examples/verl/run_paper_single_node.sh, drawn from verl 0.9.1's own checks and asserts
(`validate_config`, the config dataclasses, the engine worker, `rearrange_micro_batches`, vLLM's `max_tokens`
clamp, the separate_async trainer) and the entry point's (replay group, run folder, seeds), each refused with exit
2 naming the key the user typed, with a fix that the test applies and that then passes; and valid launches that
pass. The host is a faked CPU machine; nothing starts Ray."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("verl.protocol")
pytest.importorskip("hydra")

from grpo_replay.errors import exit_code  # noqa: E402
from grpo_replay.preflight.host import Host  # noqa: E402
from grpo_replay.preflight.verl_launch import captured_overrides, check_verl_overrides  # noqa: E402

CPU_HOST = Host(gpus=0, gpu_memory=0, driver=None, torch="2.11.0+cpu", torch_cuda=None, vllm=None)
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "examples/verl/run_paper_single_node.sh"
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
STATIC = [f"{A}.use_dynamic_bsz=false", f"{R}.log_prob_use_dynamic_bsz=false"]


def _other_runs_folder(tmp: Path) -> None:
    """The folder of this launch's run holds global_step_20 of the GRPO arm (its record says so)."""
    folder = tmp / "ckpt" / "qwen3-4b-base-math-replay-paper-v1-sync-s0"
    folder.mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text("20")
    record = {"model": "Qwen/Qwen3-4B-Base", "replay.preset": "grpo", "replay.seed": 0, "data.seed": 0,
              "actor_rollout_ref.rollout.seed": 0, "actor_rollout_ref.actor.data_loader_seed": 0,
              "trainer.use_v1": True, "trainer.v1.trainer_mode": "sync"}
    (folder / "grpo_replay_run.json").write_text(json.dumps(record))


# (id, launcher variables, overrides after the script, the key as the user typed it, fix: (variables, overrides;
# "!key" takes the launch's override of key out))
BAD = [
    ("max_model_len below prompt + response", {}, [f"{R}.max_model_len=4096"], f"{R}.max_model_len",
     ({}, [f"{R}.max_model_len=5120"])),
    ("update token cap below one sequence", {}, [f"{A}.ppo_max_token_len_per_gpu=4096"],
     f"{A}.ppo_max_token_len_per_gpu", ({}, [f"{A}.ppo_max_token_len_per_gpu=8192"])),
    ("old-log-prob token cap below one sequence", {}, [f"{R}.log_prob_max_token_len_per_gpu=2048"],
     f"{R}.log_prob_max_token_len_per_gpu", ({}, [f"{R}.log_prob_max_token_len_per_gpu=5120"])),
    ("longer answers than the token caps", {}, ["data.max_response_length=30000"], "data.max_response_length",
     ({}, [f"{A}.ppo_max_token_len_per_gpu=32000", f"{R}.log_prob_max_token_len_per_gpu=32000"])),
    ("log-prob dynamic batches off, update on", {}, [f"{R}.log_prob_use_dynamic_bsz=false"],
     f"{R}.log_prob_use_dynamic_bsz", ({}, [f"{R}.log_prob_use_dynamic_bsz=true"])),
    ("static update micro-batch unset", {}, STATIC, f"{A}.ppo_micro_batch_size_per_gpu",
     ({}, [f"{A}.ppo_micro_batch_size_per_gpu=4", f"{R}.log_prob_micro_batch_size_per_gpu=8"])),
    ("static log-prob micro-batch unset", {}, [*STATIC, f"{A}.ppo_micro_batch_size_per_gpu=4"],
     f"{R}.log_prob_micro_batch_size_per_gpu", ({}, [f"{R}.log_prob_micro_batch_size_per_gpu=8"])),
    ("static micro-batch that does not divide a GPU's share", {},
     [*STATIC, f"{A}.ppo_micro_batch_size_per_gpu=3", f"{R}.log_prob_micro_batch_size_per_gpu=8"],
     f"{A}.ppo_micro_batch_size_per_gpu", ({}, [f"{A}.ppo_micro_batch_size_per_gpu=4"])),
    ("mini-batch that does not divide the batch", {}, [f"{A}.ppo_mini_batch_size=48"], f"{A}.ppo_mini_batch_size",
     ({}, [f"{A}.ppo_mini_batch_size=64"])),
    ("GPUs that do not divide the mini-batch", {"N_GPUS": "6"}, [], "trainer.n_gpus_per_node",
     ({"PROMPTS": "96"}, [])),
    ("seed loop over replay.seed alone", {}, ["replay.seed=1"], "replay.seed", ({"SEED": "1"}, [])),
    ("seed loop over replay.seed in plain verl", {}, ["replay.seed=2", "data.seed=null", f"{R}.seed=42",
                                                      f"{A}.data_loader_seed=42", f"{A}.fsdp_config.seed=42"],
     "replay.seed", ({}, ["data.seed=2", f"{R}.seed=2", f"{A}.data_loader_seed=2", f"{A}.fsdp_config.seed=2"])),
    ("a folder with another run's checkpoints", {"_prepare": _other_runs_folder}, [], "trainer.default_local_dir",
     ({}, ["trainer.resume_mode=disable"])),
    ("a folder every seed shares", {}, ["trainer.default_local_dir=CKPT/shared"], "trainer.default_local_dir",
     ({}, ["trainer.default_local_dir=CKPT/${trainer.experiment_name}"])),
    ("missing data folder", {"DATA": "/nonexistent/math"}, [], "data.train_files", ({"DATA": "TMP"}, [])),
    ("list of train files with one missing", {}, ["data.train_files=[TMP/train.parquet,TMP/more.parquet]"],
     "data.train_files", ({}, ["data.train_files=[TMP/train.parquet,TMP/test.parquet]"])),
    ("GAE (a critic)", {}, ["algorithm.adv_estimator=gae"], "algorithm.adv_estimator",
     ({}, ["algorithm.adv_estimator=grpo"])),
    ("prefix grouper on v1", {}, [f"{A}.use_prefix_grouper=true"], f"{A}.use_prefix_grouper",
     ({}, [f"{A}.use_prefix_grouper=false"])),
    ("negative replay age", {}, ["replay.tau_max=-3"], "replay.tau_max", ({}, ["replay.tau_max=10"])),
    ("a replay key that does not exist", {}, ["replay.tau=5"], "replay.tau", ({}, ["!replay.tau", "replay.tau_max=5"])),
    ("an unknown trainer mode", {"MODE": "async"}, [], "trainer.v1.trainer_mode", ({"MODE": "colocate_async"}, [])),
    ("an off-policy threshold that forbids replay", {"MODE": "colocate_async"},
     ["trainer.v1.sampler.max_off_policy_threshold=1"], "trainer.v1.sampler.max_off_policy_threshold",
     ({}, ["trainer.v1.sampler.max_off_policy_threshold=8"])),
    ("separate_async sync steps that do not divide the batch", {"MODE": "separate_async", "SYNC_STEPS": "3"}, [],
     "trainer.v1.separate_async.parameter_sync_step", ({"SYNC_STEPS": "2"}, [])),
    ("TransferQueue storage too small for replay", {}, ["transfer_queue.backend.SimpleStorage.total_storage_size=1000"],
     "transfer_queue.backend.SimpleStorage.total_storage_size",
     ({}, ["transfer_queue.backend.SimpleStorage.total_storage_size=100000"])),
    ("a loss aggregation verl does not have", {}, [f"{A}.loss_agg_mode=seq-mean"], f"{A}.loss_agg_mode",
     ({}, [f"{A}.loss_agg_mode=token-mean"])),
]

GOOD = [
    ("the documented launch", {}, ["trainer.total_training_steps=300"]),
    ("colocate_async", {"MODE": "colocate_async"}, []),
    ("separate_async, 2 sync steps", {"MODE": "separate_async", "SYNC_STEPS": "2"}, []),
    ("the legacy trainer", {"TRAINER": "legacy"}, []),
    ("the GRPO arm, seed 2", {"PRESET": "grpo", "SEED": "2"}, []),
    ("uniform_pool on 4 GPUs", {"PRESET": "uniform_pool", "N_GPUS": "4"}, []),
    ("static micro-batches", {}, [*STATIC, f"{A}.ppo_micro_batch_size_per_gpu=4",
                                  f"{R}.log_prob_micro_batch_size_per_gpu=8"]),
    ("a list of train files", {}, ["data.train_files=[TMP/train.parquet,TMP/test.parquet]"]),
    ("max_model_len that holds prompt + response", {}, [f"{R}.max_model_len=8192"]),
    ("64 prompts per step", {"PROMPTS": "64"}, []),
    ("a rerun of its own run resumes", {"_prepare": "own"}, []),
]


def _check(tmp: Path, env: dict, extra: list):
    env = {"MODEL": "Qwen/Qwen3-4B-Base", "DATA": str(tmp), "CKPT_ROOT": str(tmp / "ckpt"), **env}
    env = {k: v.replace("TMP", str(tmp)) if isinstance(v, str) else v for k, v in env.items() if k != "_prepare"}
    extra = [o.replace("TMP", str(tmp)).replace("CKPT", str(tmp / "ckpt")) for o in extra]
    overrides = captured_overrides([*(f"{k}={v}" for k, v in env.items()), "bash", SCRIPT, *extra])
    return check_verl_overrides(overrides, CPU_HOST, None, "verl")


@pytest.fixture()
def tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the launcher's relative path; its folders are all under tmp_path
    (tmp_path / "train.parquet").touch()
    (tmp_path / "test.parquet").touch()
    return tmp_path


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_preflight_refuses_a_bad_verl_launch_naming_the_key_and_the_fix_passes(tmp, case):
    _, env, extra, typed, (fix_env, fix_extra) = case
    if "_prepare" in env:
        env["_prepare"](tmp)
    report = _check(tmp, env, extra)
    assert report.refusals, report.render()
    with pytest.raises(Exception) as refused:
        report.raise_if_refused()
    assert exit_code(refused.value) == 2
    first, lines = report.refusals[0], " ".join(r.line() for r in report.refusals)
    assert typed in first.line() and first.fix, report.render()
    # the fix applied below is the one the refusals name: its keys, or the launcher value they ask for
    words = [o.lstrip("!").split("=")[0].rsplit(".", 1)[-1] for o in fix_extra]
    words += [v for v in fix_env.values() if not v.isdigit() and v != "TMP"]
    assert all(w in lines for w in words), (words, lines)
    dropped = {o[1:] for o in fix_extra if o.startswith("!")}
    kept = [o for o in extra if o.split("=")[0] not in dropped]
    fixed = _check(tmp, {**env, **fix_env}, [*kept, *(o for o in fix_extra if not o.startswith("!"))])
    assert not fixed.refusals, fixed.render()


@pytest.mark.parametrize("case", GOOD, ids=[c[0] for c in GOOD])
def test_preflight_passes_a_valid_verl_launch_and_writes_nothing(tmp, case):
    _, env, extra = case
    if env.get("_prepare") == "own":
        assert not _check(tmp, {}, []).refusals
        from grpo_replay.integrations.verl.run_folder import LATEST, RECORD

        folder = tmp / "ckpt" / "qwen3-4b-base-math-replay-paper-v1-sync-s0"
        assert not folder.exists()  # the preflight records nothing
        _record_own_run(tmp, folder, RECORD, LATEST)
    before = sorted(p for p in tmp.rglob("*"))
    report = _check(tmp, env, extra)
    assert not report.refusals, report.render()
    assert "accepted by the entry point's checks" in report.render()
    assert sorted(p for p in tmp.rglob("*")) == before
    if env.get("_prepare") == "own":
        assert "resumes global_step_20" in report.render()


def _record_own_run(tmp: Path, folder: Path, record: str, latest: str) -> None:
    """The record the entry point writes for this launch, and verl's pointer to its step 20."""
    from hydra import compose, initialize_config_module

    from grpo_replay.integrations.verl.run_folder import check_run_folder

    env = {"MODEL": "Qwen/Qwen3-4B-Base", "DATA": str(tmp), "CKPT_ROOT": str(tmp / "ckpt")}
    overrides = captured_overrides([*(f"{k}={v}" for k, v in env.items()), "bash", SCRIPT])
    with initialize_config_module("grpo_replay.integrations.verl.config", version_base=None):
        check_run_folder(compose("replay_ppo_trainer", overrides=overrides))  # writes the record
    assert (folder / record).is_file()
    (folder / latest).write_text("20")
