"""`grpo-replay preflight` on every GPU recipe the docs give, full size, on this CPU machine: each documented
command (collected as tests/docs/test_gpu_commands.py collects them) resolves as its launch would and passes; the
defects the preflight exists for are refused with exit 2, naming the field."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpu_commands import VERL_SCRIPTS, from_the_checkout, preflight_launches
from grpo_replay.cli import main
from grpo_replay.cli.preflight import resolve
from grpo_replay.preflight.host import Host
from grpo_replay.preflight.verl_launch import ENTRY, check_verl_overrides, overrides_dict

pytest.importorskip("trl")

CPU_HOST = Host(gpus=0, gpu_memory=0, driver=None, torch="2.13.0+cpu", torch_cuda=None, vllm=None)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def documented(tmp_path_factory):
    """Every launch of the docs' GPU fences: (source, kind, argv)."""
    return preflight_launches(tmp_path_factory.mktemp("docs"), ENTRY)


def test_every_kind_of_documented_launch_is_collected(documented):
    kinds = {kind for _, kind, _ in documented}
    assert kinds == {"grpo-replay", "accelerate", "verl"}, documented
    assert any(a[0] == "compare" and "--backend" in a for _, k, a in documented if k == "grpo-replay")


def _report(kind, argv, tmp_path):
    argv = from_the_checkout(argv)
    if kind == "verl":
        ov = overrides_dict(argv)
        for key in ("data.train_files", "data.val_files"):  # the recipe's data: prepared by the user
            Path(ov[key]).parent.mkdir(parents=True, exist_ok=True)
            Path(ov[key]).touch()
        return check_verl_overrides(argv, CPU_HOST, None, "verl " + " ".join(argv))
    launch = ["grpo-replay", *argv] if kind == "grpo-replay" else ["accelerate", *argv]
    return resolve(launch, CPU_HOST, None)


def test_every_documented_gpu_launch_passes_its_preflight(documented, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the launches' relative run folders: the test's (`from_the_checkout`)
    failed = []
    for source, kind, argv in documented:
        report = _report(kind, argv, tmp_path)
        text = report.render()
        refusals = report.refusals
        assert refusals or all(s in text for s in ("replay rows per step", "memory per GPU", "seeds")), text
        if refusals:
            failed.append(f"{source}: {' '.join(argv)[:120]}: {[r.line() for r in refusals]}")
    assert not failed, "\n".join(failed)


def test_the_paper_recipe_trl_split_of_one_row_micro_batches_is_refused(tmp_path, capsys):
    """micro_batch_size=1 under --backend trl: 1024 fresh + 512 planned replay rows in 1024 one-row micro-batches hold
    0 or 1024 replay rows (ratio 0 or 1, as near 0.5: the fewer), so no replay row would train: refused."""
    data = str(ROOT.parent / "shared" / "data" / "train" / "math_train.jsonl")
    argv = ["preflight", "grpo-replay", "train", "--backend", "trl", "--model", "Qwen/Qwen3-0.6B-Base", "--reward",
            "math", "--data", data, "--out", str(tmp_path / "run"), "--set", "prompts_per_step=128", "--set",
            "group_size=8", "--set", "max_new_tokens=4096", "--set", "micro_batch_size=1", "--set", "generator=vllm"]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert "REFUSED" in out.out and "micro_batch_size: TrainConfig.micro_batch_size=1" in out.out
    assert "0 replay after the mapping" in out.out and "share 0.000 vs configured 0.333" in out.out


def test_a_trl_split_under_which_replay_would_vanish_is_refused(tmp_path, capsys):
    """Two rows a step at replay_ratio 0.2 plan round(0.4) = 0 replay rows: the arm would be GRPO, refused."""
    argv = ["preflight", "grpo-replay", "train", "--backend", "trl", "--reward", "testbed", "--out",
            str(tmp_path / "run"), "--set", "prompts_per_step=1", "--set", "group_size=2",
            "--set", "replay.replay_ratio=0.2", "--set", "micro_batch_size=1"]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert "REFUSED" in out.out and "micro_batch_size: TrainConfig.micro_batch_size=1" in out.out
    assert "share 0.000 vs configured 0.000" in out.out


def test_a_card_too_small_and_an_old_driver_are_refused(tmp_path):
    """4B in the built-in trainer on an 80 GB card (with the GPU named); a CUDA 13 build on a 570 driver."""
    launch = ["grpo-replay", "train", "--model", "Qwen/Qwen3-4B-Base", "--reward", "math", "--data", "word_sums",
              "--out", str(tmp_path / "run"), "--set", "prompts_per_step=128", "--set", "group_size=8", "--set",
              "max_new_tokens=4096", "--set", "micro_batch_size=1", "--set", "generator=vllm"]
    small = resolve(launch, CPU_HOST, 81559 * 2**20)
    assert [r.field for r in small.refusals] == ["micro_batch_size"]  # the term that dominates: the update
    assert "needs at least" in small.refusals[0].problem and "most of it the update" in small.refusals[0].problem
    assert not resolve(launch, CPU_HOST, 143771 * 2**20).refusals  # 141 GB: fits by the estimate
    old = Host(gpus=1, gpu_memory=143771 * 2**20, driver="570.86.15", torch="2.13.0+cu130", torch_cuda="13.0",
               vllm="0.31.0")
    refused = resolve(launch, old, None).refusals
    assert [r.field for r in refused] == ["NVIDIA driver"]
    assert "older than the 580 CUDA 13.0 builds of torch 2.13.0+cu130 need" in refused[0].problem
    assert refused[0].fix.startswith("install NVIDIA driver >= 580")


def test_a_run_directory_with_another_runs_results_is_refused(tmp_path):
    """A compare or train launch into a directory holding a different run: refused before any GPU time."""
    from grpo_replay.trainer.rundir import mark

    out = tmp_path / "run"
    mark(out)
    (out / "config.yaml").write_text("seed: 5\n")
    (out / "summary.json").write_text("{}")
    report = resolve(["train", "--steps", "3", "--out", str(out)], CPU_HOST, None)
    assert [r.field for r in report.refusals] == ["--out"], report.render()
    assert "seed: 5 in the run, 0 here" in report.refusals[0].problem, report.render()  # the key that differs


def test_a_shared_verl_checkpoint_folder_and_a_seed_loop_over_replay_seed_only_are_refused():
    ov = ["replay=paper", "data.train_batch_size=128", "actor_rollout_ref.rollout.n=8", "trainer.n_gpus_per_node=8",
          "trainer.nnodes=2", "trainer.experiment_name=qwen3-4b-paper-s1", "replay.seed=1",
          "actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.actor.use_dynamic_bsz=true",
          "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
          "trainer.default_local_dir=/shared/checkpoints/grpo-replay", "actor_rollout_ref.model.path=Qwen/Qwen3-4B-Base"]
    fields = [r.field for r in check_verl_overrides(ov, CPU_HOST, None, "verl").refusals]
    assert fields == ["data.seed", "trainer.default_local_dir"]
    fixed = [*ov[:-2], "trainer.default_local_dir=/shared/checkpoints/qwen3-4b-paper-s1", "data.seed=1",
             "actor_rollout_ref.rollout.seed=1", ov[-1]]
    assert not check_verl_overrides(fixed, CPU_HOST, None, "verl").refusals
