"""`--backend trl`: every key of TrainConfig reaches TRL, is used by the command around TRL, or is refused with
exit 2 naming it. The table below is enumerated against TrainConfig's fields, so a new key without a decision
fails here."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

from grpo_replay.cli import main  # noqa: E402
from grpo_replay.trainer.trl import settings as trl_settings  # noqa: E402
from grpo_replay.trainer.train_config import FIELDS, resolve  # noqa: E402

# key -> (a non-default value, the ReplayGRPOConfig field it must set and the value it must have there)
TO_TRL = {
    "preset": ("sigma_pool", "replay_preset", "sigma_pool"),
    "seed": (3, "seed", 3),
    "steps": (7, "max_steps", 7),
    "prompts_per_step": (3, "per_device_train_batch_size", 3 * 8),
    "micro_batch_size": (64, "gradient_accumulation_steps", 32 * 8 // 64),  # and steps_per_generation, below
    "generator": ("vllm", "use_vllm", True),
    "group_size": (4, "num_generations", 4),
    "lr": (0.01, "learning_rate", 0.01),
    "weight_decay": (0.1, "weight_decay", 0.1),
    "max_grad_norm": (0.5, "max_grad_norm", 0.5),
    "temperature": (0.7, "temperature", 0.7),
    "max_new_tokens": (5, "max_completion_length", 5),
    "advantage_scale": ("batch", "scale_rewards", "batch"),  # none: test_cli_settings_reach_trl
    "checkpoint_every": (3, "save_steps", 3),
    "keep_checkpoints": (4, "save_total_limit", 4),
    "out_dir": ("elsewhere/x", "output_dir", "elsewhere/x"),
    "device": ("cpu", "use_cpu", True),
    "precision": ("bf16", "bf16", True),  # auto: bf16 on a GPU only; this machine's default gives float32
    "progress": (False, "disable_tqdm", True),
    "report_to": ("tensorboard", "report_to", ["tensorboard"]),
    "loss.eps_low": (0.1, "epsilon", 0.1),
    "loss.eps_high": (0.4, "epsilon_high", 0.4),
    "loss.dual_clip_c": (3.0, "delta", 3.0),
    "loss.aggregation": ("seq_mean", "loss_type", "grpo"),
    "loss.beta": (0.04, "beta", 0.04),
    "loss.max_completion_length": (None, "max_completion_length", None),  # checked below with the budget
    "replay.": (None, None, None),  # every replay field, below
}
# key -> a value refused with backend=trl
REFUSED = {"drift_probe": 8, "update_epochs": 2, "dynamic_sampling": True,
           "max_generation_rounds": 3, "advantage_estimator": "rloo"}  # max_generation_rounds: only with dynamic_sampling, refused with TRL
# keys used by the command around TRL (evaluation, reward scoring, warm start, the real-model path, callbacks):
# each is exercised by the tests named here.
AROUND = {
    "eval_every": "test_around_settings_take_effect",
    "eval_problems": "test_around_settings_take_effect",
    "eval_samples": "test_around_settings_take_effect",
    "max_bad_steps": "test_max_bad_steps_stops_the_run",
    "reward_timeout": "test_cli_settings_reach_trl (handed to the testbed reward's RewardScorer)",
    "reward_funcs": "tests/integrations/test_trl_estimators.py::test_backend_trl_trains_on_the_weighted_reward",
    "reward_weights": "tests/integrations/test_trl_estimators.py::test_backend_trl_trains_on_the_weighted_reward",
    "torch_threads": "test_around_settings_take_effect",
    "lr_warmup_steps": "tests/trainer/test_trl_run_records.py::test_both_backends_log_one_lr_sequence (a callback)",
    "backend": "this file",
    "model": "tests/realmodel (the real-model path)",
    "model_file": "tests/realmodel",
    "data": "tests/realmodel",
    "reward": "tests/realmodel",
    "heldout_data": "tests/realmodel",
    "testbed_preset": "tests/trainer/test_reasoning_testbed.py (the TRL run directory and warm start)",
    "testbed.": "the warm start and task: train_testbed_with_trl(cfg) loads cfg.testbed's, as the built-in trainer",
}


def _decided(key: str) -> str | None:
    for table in (TO_TRL, REFUSED, AROUND):
        if key in table:
            return key
        if "." in key and key.split(".")[0] + "." in table:
            return key.split(".")[0] + "."
    return None


def test_every_trainconfig_key_has_a_decision():
    undecided = [k for k in FIELDS if _decided(k) is None]
    assert not undecided, f"TrainConfig keys with no --backend trl decision in this test: {undecided}"
    assert [k for k in FIELDS if trl_settings.decision(k) is None] == []


@pytest.mark.parametrize("key", [k for k in TO_TRL if not k.endswith(".")])
def test_setting_reaches_trl(key):
    value, field, expected = TO_TRL[key]
    cfg = resolve({"backend": "trl", key: value})
    trl_settings.check(cfg)
    got = trl_settings.trl_kwargs(cfg)
    if key == "loss.max_completion_length":  # None or the completion budget, which TRL normalises dr_grpo by
        cfg = resolve({"backend": "trl", "loss.aggregation": "dr_grpo", "loss.max_completion_length": 12,
                       "max_new_tokens": 12})
        trl_settings.check(cfg)
        assert trl_settings.trl_kwargs(cfg)["max_completion_length"] == 12
        return
    assert got[field] == expected, (key, got[field])
    if key != "device":  # auto is cpu on a machine without CUDA
        assert trl_settings.trl_kwargs(resolve({"backend": "trl"}))[field] != expected, "the default already gives it"


def test_micro_batches_and_vllm_reach_trl():
    """micro_batch_size: TRL trains micro rows at a time over one generation per optimizer step; generator=vllm:
    TRL's colocated vLLM. ReplayGRPOConfig accepts both and derives the same generation batch."""
    from grpo_replay.integrations.trl import ReplayGRPOConfig

    cfg = resolve({"backend": "trl", "prompts_per_step": 4, "group_size": 8, "micro_batch_size": 8, "generator": "vllm"})
    trl_settings.check(cfg)
    kw = trl_settings.trl_kwargs(cfg)
    assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"], kw["steps_per_generation"]) == (8, 4, 4)
    assert kw["use_vllm"] and kw["vllm_mode"] == "colocate"
    args = ReplayGRPOConfig(**{**kw, "use_cpu": True, "bf16": False})
    assert args.generation_batch_size == 32 and args.use_vllm
    whole = trl_settings.trl_kwargs(resolve({"backend": "trl", "prompts_per_step": 4, "group_size": 8}))
    assert (whole["per_device_train_batch_size"], whole["gradient_accumulation_steps"], whole["use_vllm"]) == (32, 1, False)


def test_replay_fields_reach_trl():
    from grpo_replay.integrations.trl import ReplayGRPOConfig

    ov = {"replay.tau_max": 3, "replay.replay_ratio": 0.25, "replay.alpha": 0.5, "replay.eps": 0.01,
          "replay.priority": "uniform", "replay.composition": "pool", "replay.granularity": "group",
          "replay.warmup_steps": 4, "replay.capacity": 100, "replay.replacement": True, "replay.max_uses": 2,
          "replay.age_decay": 5.0, "replay.fill_filtered": False, "replay.max_drift": 0.5}
    # Every replay key: set here to a value TRL must receive.
    assert sorted(ov) == sorted(k for k in FIELDS if k.startswith("replay."))
    for extra in ({}, {"replay.composition": "fresh_anchored", "replay.fill_filtered": True}):
        cfg = resolve({"backend": "trl", **ov, **extra})
        args = ReplayGRPOConfig(**{**trl_settings.trl_kwargs(cfg), "use_cpu": True, "bf16": False})
        assert args.to_replay_config() == cfg.replay


@pytest.mark.parametrize("key,value", [
    *REFUSED.items(), ("loss.dual_clip_c", 1.2), ("loss.max_completion_length", 7), ("micro_batch_size", 3),
])
def test_refused_with_exit_2_before_anything(key, value, tiny_overrides, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--backend", "trl", "--out", str(out)]
    for k, v in {**tiny_overrides, key: value}.items():
        argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"TrainConfig.{key}=" in err and "allowed:" in err, err
    assert not out.exists()  # nothing written, nothing trained


def test_a_split_under_which_replay_would_vanish_is_refused(tiny_overrides, tmp_path, capsys):
    """32 rows at replay_ratio 0.01 plan round(0.32) = 0 replay rows: the arm would be GRPO, refused before training."""
    out = tmp_path / "run"
    argv = ["train", "--backend", "trl", "--out", str(out)]
    for k, v in {**tiny_overrides, "micro_batch_size": 1, "replay.replay_ratio": 0.01}.items():
        argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "TrainConfig.micro_batch_size=1" in err and "would train no replay row" in err, err
    assert not out.exists()


def test_the_paper_recipe_maps_to_the_split_the_plan_trains():
    """docs/paper_table.md's TRL line: 128 prompts x 8 at micro_batch_size=1 split 1,024 fresh + 512 planned replay
    rows into 1,024 one-row micro-batches, which hold 0 or 1,024 (ratio 0 or 1, as near 0.5: the fewer), so replay
    would vanish: refused; at micro_batch_size=2 each of the 512 forwards holds 3 rows and the share is 1/3."""
    from grpo_replay.errors import ConfigError

    recipe = {"backend": "trl", "prompts_per_step": 128, "group_size": 8, "max_new_tokens": 4096}
    with pytest.raises(ConfigError, match="would train no replay row"):
        trl_settings.check(resolve({**recipe, "micro_batch_size": 1}))
    cfg = resolve({**recipe, "micro_batch_size": 2})
    trl_settings.check(cfg)
    share = trl_settings.trl_share(cfg)
    assert (share.kept, share.replay, share.unit, share.rows // share.unit) == (1024, 512, 512, 3)
    assert trl_settings.trl_kwargs(cfg)["steps_per_generation"] == 512


def test_real_model_path_refuses_before_loading(tmp_path):
    from grpo_replay.errors import ConfigError
    from grpo_replay.trainer.train_config import TrainConfig
    from grpo_replay.trainer.trl.backend import train_with_trl

    cfg = TrainConfig(backend="trl", reward="math", data="word_sums", model=str(tmp_path / "absent"),
                      micro_batch_size=3, out_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"TrainConfig.micro_batch_size=3 is invalid; allowed: 0 or a divisor"):
        train_with_trl(cfg)
    assert not (tmp_path / "run").exists()


def test_cli_settings_reach_trl(tiny_overrides, tmp_path, monkeypatch):
    """The testbed path hands every mapped setting to TRL (it hard-coded beta 0, temperature 1, dapo, ...): the
    ReplayGRPOConfig that train_testbed_with_trl builds, and the reward's timeout."""
    import grpo_replay.integrations.trl as trl_integration
    import grpo_replay.trainer.trl.backend as backend

    seen = {}
    dataset_and_reward = backend._dataset_and_reward

    def reward_with(task, problems, timeout=None):
        seen["reward_timeout"] = timeout
        return dataset_and_reward(task, problems, timeout)

    def stop(**kw):
        seen.update(kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(backend, "_dataset_and_reward", reward_with)
    monkeypatch.setattr(trl_integration, "ReplayGRPOConfig", stop)
    ov = {**tiny_overrides, "loss.beta": 0.04, "temperature": 0.7, "loss.eps_low": 0.1, "loss.eps_high": 0.3,
          "loss.aggregation": "dr_grpo", "max_grad_norm": 0.5, "weight_decay": 0.1, "advantage_scale": "none",
          "lr_warmup_steps": 2, "loss.dual_clip_c": 3.0, "reward_timeout": 4.0}
    argv = ["train", "--backend", "trl", "--out", str(tmp_path / "run")]
    for k, v in ov.items():
        argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    want = dict(beta=0.04, temperature=0.7, epsilon=0.1, epsilon_high=0.3, loss_type="dr_grpo", max_grad_norm=0.5,
                weight_decay=0.1, scale_rewards="none", lr_scheduler_type="constant",
                delta=3.0, reward_timeout=4.0, save_steps=2, save_strategy="steps")
    assert {k: seen[k] for k in want} == want


def _argv(ov, out):
    argv = ["train", "--backend", "trl", "--out", str(out)]
    for k, v in ov.items():
        argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return argv


def test_around_settings_take_effect(tiny_overrides, tmp_path):
    import torch

    threads = torch.get_num_threads()
    out = tmp_path / "run"
    ov = {**tiny_overrides, "steps": 4, "eval_every": 2, "eval_problems": 8, "eval_samples": 1, "torch_threads": 2,
          "checkpoint_every": 2, "keep_checkpoints": 1}
    try:
        assert main(_argv(ov, out)) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    evals = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2, 4]  # every eval_every steps, and at the start and end
    assert [e["generated"] for e in evals] == [0, 2 * 8 * 4, 4 * 8 * 4]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]  # keep_checkpoints=1
    # Resuming the finished run with more steps continues from its last checkpoint and keeps its evaluations.
    assert main(_argv({**ov, "steps": 6}, out)) == 0
    evals = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2, 4, 6]
    assert json.loads((out / "summary.json").read_text())["resumed_from"].endswith("checkpoint-4")


def test_max_bad_steps_stops_the_run(tiny_overrides, tmp_path, capsys):
    out = tmp_path / "run"
    ov = {**tiny_overrides, "steps": 6, "lr": 1e30, "max_bad_steps": 2, "eval_every": 0, "checkpoint_every": 0}
    assert main(_argv(ov, out)) == 1  # stopped, rerun to resume
    assert "2 consecutive steps had non-finite gradients" in capsys.readouterr().err
    assert list(out.glob("checkpoint-*")), "no checkpoint written at the stop"


def test_micro_batch_size_trains_through_trl_in_micro_batches(tiny_overrides, tmp_path, monkeypatch):
    """TRL's real train(): 8 x 4 = 32 rows per step at micro_batch_size=8 is one generation and 4 forward/backward
    micro-steps per optimizer step, each of 8 fresh rows plus its share of the replay rows."""
    from grpo_replay.integrations.trl import ReplayGRPOTrainer

    micro_rows, generations = [], []
    real_loss, real_generate = ReplayGRPOTrainer.compute_loss, ReplayGRPOTrainer._generate_and_score_completions

    def compute_loss(self, model, inputs, *a, **k):
        micro_rows.append(int(inputs["completion_ids"].shape[0]))
        return real_loss(self, model, inputs, *a, **k)

    def generate(self, inputs):
        out = real_generate(self, inputs)
        generations.append(int(out["completion_ids"].shape[0]))
        return out

    monkeypatch.setattr(ReplayGRPOTrainer, "compute_loss", compute_loss)
    monkeypatch.setattr(ReplayGRPOTrainer, "_generate_and_score_completions", generate)
    out = tmp_path / "run"
    ov = {**tiny_overrides, "steps": 4, "micro_batch_size": 8, "eval_every": 0, "checkpoint_every": 0}
    assert main(_argv(ov, out)) == 0
    assert len(micro_rows) == 4 * 4 and len(generations) == 4
    assert generations[0] == 32  # warm-up: fresh rows only
    assert all(r == g // 4 for r, g in zip(micro_rows[::4], generations))  # each generation split in 4 micro-steps
    assert max(generations) > 32  # replay rows joined the generation after the warm-up
