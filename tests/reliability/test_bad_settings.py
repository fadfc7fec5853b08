"""Settings that used to end in a traceback (exit 1, which means "rerun to resume") are refused with exit 2 before
any compute, naming the field; a flag or key given twice is refused; numbers read the same from a flag, --set and
a config file."""
import importlib.util
import json
import typing

import pytest
import torch
import yaml

from grpo_replay.errors import ConfigError
from grpo_replay.app import configio
from grpo_replay.cli import main
from grpo_replay.trainer.train_config import FIELDS, MAX_SEED
from helpers import refused

TINY = ["--steps", "2", "--set", "eval_problems=8", "--no-progress"]


@pytest.mark.parametrize("extra, shown", [
    (["--seed", "-1"], "TrainConfig.seed=-1 is invalid; allowed: an integer in 0..2147483647"),
    (["--seed", "-1", "--backend", "trl"], "TrainConfig.seed=-1 is invalid"),
    (["--seed", "4294967296"], "TrainConfig.seed=4294967296 is invalid"),
    (["--set", "testbed.difficulty_weights=[0,0,0,0]"], "TestbedConfig.difficulty_weights=(0.0, 0.0, 0.0, 0.0) is invalid"),
    (["--set", "testbed.working_prob=[]"], "TestbedConfig.working_prob=() is invalid; allowed: a non-empty list"),
    (["--set", "testbed.heldout_mod=0"], "TestbedConfig.heldout_mod=0 is invalid; allowed: an integer >= 2"),
    (["--set", "testbed.num_heads=3"], "TestbedConfig.num_heads=3 is invalid; allowed: a divisor of hidden_size=128"),
    (["--set", "testbed.max_new_tokens=0"], "TestbedConfig.max_new_tokens=0 is invalid; allowed: an integer >= 1"),
    # a task other than the named testbed's: both keys named (it was difficulty_weights, which neither gave)
    (["--testbed", "reasoning", "--set", "testbed.task=addition"], "testbed.task='addition' is invalid with "
     "testbed_preset='reasoning' (--testbed reasoning), which is the running_sum task; allowed: testbed.task=running_sum, "
     "or testbed_preset=default|small|large for the addition task"),
    (["--set", "testbed.task=running_sum"], "TestbedConfig.difficulty_weights has 4 weights for task='running_sum', "
     "whose levels are operands_min..operands_max = 3..8; allowed: one weight per level (6)"),
])
def test_settings_that_crashed_mid_run_are_refused_naming_the_field(extra, shown, tmp_path, capsys):
    out = tmp_path / "run"
    refused(["train", *TINY, *extra, "--out", str(out)], out, capsys, "config error: " + shown)


# --- the range of every integer key ------------------------------------------------------------------------------
# The lowest value each integer key accepts, and the highest where there is one. A new integer key fails
# test_every_integer_key_has_a_stated_range until its range is stated here (and checked by its config class).
LOWEST = {
    "seed": 0, "steps": 1, "prompts_per_step": 1, "group_size": 2, "lr_warmup_steps": 0, "max_new_tokens": 0,
    "micro_batch_size": 0, "update_epochs": 1, "max_generation_rounds": 1, "eval_every": 0, "eval_problems": 1,
    "eval_samples": 1, "checkpoint_every": 0, "keep_checkpoints": 1, "drift_probe": 0, "max_bad_steps": 1,
    "torch_threads": 0, "replay.tau_max": 0, "replay.warmup_steps": 0, "replay.capacity": 1, "replay.max_uses": 1,
    "loss.max_completion_length": 1, "testbed.digits_min": 1, "testbed.digits_max": 1, "testbed.operands_min": 2,
    "testbed.operands_max": 2, "testbed.three_operand_digits": 1, "testbed.heldout_mod": 2, "testbed.max_new_tokens": 1,
    "testbed.hidden_size": 1, "testbed.num_layers": 1, "testbed.num_heads": 1, "testbed.intermediate_size": 1,
    "testbed.max_position_embeddings": 1, "testbed.warmstart_max_steps": 0, "testbed.warmstart_batch": 1,
    "testbed.warmstart_eval_every": 1, "testbed.warmstart_eval_problems": 1, "testbed.warmstart_min_steps": 0,
    "testbed.seed": 0, "testbed.progress_every": 0,
}
HIGHEST = {"seed": MAX_SEED, "testbed.seed": MAX_SEED, "testbed.digits_max": 9, "testbed.three_operand_digits": 9,
           "testbed.operands_max": 20}


def test_every_integer_key_has_a_stated_range():
    ints = {k for k, (t, _) in FIELDS.items() if t is int or int in typing.get_args(t)}
    assert set(LOWEST) == ints


@pytest.mark.parametrize("key, value", [(k, v - 1) for k, v in LOWEST.items()] + [(k, v + 1) for k, v in HIGHEST.items()])
def test_an_integer_key_outside_its_range_is_refused_before_compute(key, value, tmp_path, capsys):
    """Exit 2 naming the key, nothing written: a negative testbed.seed used to pass and crash in the warm start."""
    out = tmp_path / "run"
    refused(["train", "--out", str(out), "--set", f"{key}={value}"], out, capsys, f"{key.rsplit('.', 1)[-1]}={value}")


def test_every_integer_key_at_the_end_of_its_range_runs(tiny_overrides, tmp_path):
    """What the ranges accept runs: one step with every integer key at its lowest value (the seeds at their highest),
    where one key's lowest is allowed only with another's (an even head width, operands with running_sum, one
    generation round with dynamic sampling)."""
    at_ends = {**LOWEST, "seed": MAX_SEED, "testbed.seed": MAX_SEED, "testbed.hidden_size": 2, "testbed.task": "running_sum",
               "testbed.difficulty_weights": [1.0], "dynamic_sampling": True, "drift_probe": 1,
               "testbed.cache_dir": tiny_overrides["testbed.cache_dir"]}
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--no-progress"]
    for k, v in at_ends.items():
        argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    assert main(argv) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
    assert yaml.safe_load((out / "config.yaml").read_text())["testbed"]["seed"] == MAX_SEED


def test_cuda_or_vllm_on_a_machine_without_them_is_refused_before_compute(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    refused(["train", *TINY, "--device", "cuda", "--out", str(out)], out, capsys,
             "TrainConfig.device='cuda' but no CUDA device is available here; allowed: auto, cpu")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    refused(["train", *TINY, "--set", "generator=vllm", "--out", str(out)], out, capsys,
             "TrainConfig.generator='vllm' needs vLLM, which is not installed")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    refused(["train", *TINY, "--set", "generator=vllm", "--out", str(out)], out, capsys,
             "TrainConfig.generator='vllm' needs a CUDA device")


# --- given twice -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, shown", [
    (["--steps", "3", "--steps", "5"], "--steps is given twice (--steps 3 and --steps 5)"),
    (["--seed", "1", "--seed", "2"], "--seed is given twice (--seed 1 and --seed 2)"),
    (["--out", "a", "--out", "b"], "--out is given twice (--out a and --out b)"),
    (["--preset", "grpo", "--preset", "paper"], "--preset is given twice (--preset grpo and --preset paper)"),
    (["--report-to", "none", "--report_to", "tensorboard"], "--report_to is given twice (--report-to none and --report_to tensorboard)"),
])
def test_a_train_flag_given_twice_isrefused(argv, shown, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(["train", *argv], tmp_path / "runs", capsys, shown + "; give it once")


def test_an_eval_flag_given_twice_isrefused(tmp_path, capsys):
    refused(["eval", "--model", "m", "--n", "2", "--n", "4", "--out", str(tmp_path / "e")], tmp_path / "e", capsys,
             "--n is given twice (--n 2 and --n 4); give it once")


def test_an_integer_with_leading_zeros_reads_the_same_from_a_flag_set_and_a_file(tmp_path):
    from grpo_replay.trainer.train_config import resolve

    assert configio.int_arg("010") == 10
    assert resolve({"steps": configio.parse_value("010")}).steps == 10  # YAML 1.1 alone reads octal 8
    f = tmp_path / "c.yaml"
    f.write_text("steps: 010\nreplay:\n  tau_max: 0_7\n")
    cfg = resolve(yaml_path=str(f))
    assert (cfg.steps, cfg.replay.tau_max) == (10, 7)
    # the other YAML 1.1 integer forms a flag refuses are refused for an int key too (they stay text)
    for text in ("0x10", "0b11", "1:30"):
        with pytest.raises(ConfigError, match="has the wrong type; expected int"):
            resolve({"steps": configio.parse_value(text)})


def test_a_config_file_with_a_key_twice_or_dotted_and_nested_isrefused(tmp_path, capsys):
    out = tmp_path / "run"
    f = tmp_path / "c.yaml"
    f.write_text("steps: 3\nsteps: 5\n")
    refused(["train", "--config", str(f), "--out", str(out)], out, capsys, "key 'steps' is given twice (line 2)")
    f.write_text("replay.tau_max: 3\nreplay:\n  tau_max: 5\n")
    refused(["train", "--config", str(f), "--out", str(out)], out, capsys, "replay.tau_max is given twice in config file")
    f.write_text("replay:\n  tau_max: 3\n  tau_max: 5\n")
    refused(["train", "--config", str(f), "--out", str(out)], out, capsys, "key 'tau_max' is given twice (line 3)")


# --- memory that cannot fit -------------------------------------------------------------------------------------
@pytest.fixture
def no_generation(monkeypatch):
    """Fail at once if a step starts generating: the refused settings must never run (their memory would not fit)."""
    from grpo_replay.generation.transformers import TransformersGenerator

    monkeypatch.setattr(TransformersGenerator, "sample", lambda *a, **k: pytest.fail("a step started generating"))


def test_a_step_too_large_for_memory_is_refused_with_the_estimate(train_args, tmp_path, monkeypatch, capsys, no_generation):
    from grpo_replay.trainer import memory

    out = tmp_path / "run"
    assert main(train_args(out, group_size=10**9)) == 2  # exabytes: too large on any machine
    err = capsys.readouterr().err
    assert "TrainConfig.prompts_per_step=8 x group_size=1000000000 = 8000000000 rows per step needs at least" in err
    assert "allowed: fewer rows per step (prompts_per_step x group_size)" in err and "Traceback" not in err
    assert not list(out.glob("ckpt-*")) and not (out / "metrics.jsonl").exists()
    # the setting, on a machine with 1 GiB available
    monkeypatch.setattr(memory, "_available_bytes", lambda device: 2**30)
    assert main(train_args(out, group_size=100_000)) == 2
    assert "), but cpu has 1.0 GiB available" in capsys.readouterr().err


def test_step_memory_estimate_counts_kv_cache_and_update_logits():
    from types import SimpleNamespace

    from grpo_replay.trainer.memory import Shape, phases

    cfg = SimpleNamespace(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                          intermediate_size=256)
    shape = Shape.of(cfg, params=1000)
    got = phases(shape, rows=10, micro_rows=5, eval_rows=3, completion=8, precision="bf16", vllm_bytes=0, kv_elem=2)
    kept = 26 * 64 + 8 * 256 + 10 * (64 + 32)  # per token and layer under bf16 autocast (q width 64, kv width 32)
    step_logits = 4 * 100 * 4  # one decoding step's float32 logits, four copies, per row
    assert got.generation == 10 * (2 * 2 * 8 * 32 * 2 + step_logits)
    assert got.evaluation == 3 * (2 * 2 * 8 * 32 * 2 + step_logits)
    # grads, bf16 copies, logits (bf16 output and three float32 tensors at the backward's peak), activations
    assert got.update == 4 * 1000 + 2 * 1000 + 5 * 8 * 100 * (2 + 12) + 5 * 8 * 2 * kept
    assert got.need == 8 * 1000 + got.update


def test_a_data_file_too_small_to_hold_eval_problems_out_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from grpo_replay.trainer import setup

    monkeypatch.setattr(setup, "load_causal_lm", lambda *a, **k: pytest.fail("the model loaded"))
    data = tmp_path / "one.jsonl"
    data.write_text('{"problem": "1+1?", "answer": "2"}\n')
    out = tmp_path / "run"
    argv = ["train", "--reward", "math", "--model", str(tmp_path), "--data", str(data), "--out", str(out),
            "--no-progress", "--device", "cpu", "--set", "eval_problems=8"]
    refused(argv, out, capsys, f"TrainConfig.eval_problems=8 is invalid with TrainConfig.data='{data}', which has 1 row(s)",
             "allowed: a data file of at least 2 rows, or TrainConfig.heldout_data")
    data.write_text("".join(
        '{"problem": "%d+1?", "answer": "%d"}\n' % (i, i + 1) for i in range(5)))
    refused(argv, out, capsys, "which has 5 row(s)", "allowed: eval_problems <= 4")
