"""The reasoning variant of the testbed as a named config: resolve(), --testbed, and a tiny end-to-end run."""
import json

import pytest
import yaml

from grpo_replay.cli import main
from grpo_replay.errors import ConfigError
from grpo_replay.tasks.testbed import TestbedConfig
from grpo_replay.trainer.train_config import TrainConfig, resolve
from helpers import read_jsonl

# The reasoning task at unit-test size: 3-4 one-digit operands, a 1-layer width-32 model, a 40-step warm start.
TINY_REASONING = {
    "testbed.operands_max": 4,
    "testbed.difficulty_weights": [1.0, 1.0],
    "testbed.hidden_size": 32,
    "testbed.num_layers": 1,
    "testbed.num_heads": 2,
    "testbed.intermediate_size": 64,
    "testbed.warmstart_max_steps": 40,
    "testbed.warmstart_batch": 16,
    "testbed.warmstart_eval_every": 20,
    "testbed.warmstart_eval_problems": 16,
    "testbed.warmstart_min_steps": 0,
}


def test_named_testbed_config_resolves():
    cfg = resolve({"testbed_preset": "reasoning"})
    assert cfg.testbed == TestbedConfig.reasoning() and cfg.testbed_preset == "reasoning"
    assert cfg.completion_budget() == TestbedConfig.reasoning().max_new_tokens
    # explicit testbed.* keys win over the named config, as replay.* keys win over --preset
    cfg2 = resolve({"testbed_preset": "reasoning", "testbed.hidden_size": 32, "testbed.operands_max": 4,
                    "testbed.difficulty_weights": [1, 1]})
    assert cfg2.testbed == TestbedConfig.reasoning(hidden_size=32, operands_max=4, difficulty_weights=(1.0, 1.0))
    # the default is untouched
    assert resolve({}).testbed == TestbedConfig() and resolve({}).testbed_preset == "default"
    # the resolved config.yaml reads back to the same config
    assert resolve(configio_flat(cfg2.to_yaml())) == cfg2
    with pytest.raises(ConfigError, match="testbed_preset"):
        resolve({"testbed_preset": "nope"})
    with pytest.raises(ConfigError, match="TestbedConfig.reasoning"):
        TrainConfig(testbed_preset="reasoning")  # a named testbed without its task
    assert TrainConfig(testbed_preset="reasoning", testbed=TestbedConfig.reasoning()).testbed.task == "running_sum"
    # its default run directory is not the default testbed's
    assert str(resolve({}).run_dir) == "runs/paper-seed0"
    assert str(cfg.run_dir) == "runs/reasoning-paper-seed0"
    assert str(resolve({"testbed_preset": "reasoning", "backend": "trl", "seed": 2}).run_dir) == "runs/trl-reasoning-paper-seed2"
    assert str(resolve({"backend": "trl"}).run_dir) == "runs/trl-paper-seed0"


def configio_flat(text: str) -> dict:
    from grpo_replay.app.configio import flatten

    return flatten(yaml.safe_load(text))


def test_cli_testbed_flag(tmp_path):
    from grpo_replay.cli.train import add_arguments, config_from_args
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--testbed", "reasoning", "--set", "testbed.hidden_size=64"]))
    assert cfg.testbed == TestbedConfig.reasoning(hidden_size=64)
    cfg = config_from_args(p.parse_args(["--set", "testbed_preset=reasoning"]))
    assert cfg.testbed == TestbedConfig.reasoning()
    with pytest.raises(SystemExit):
        p.parse_args(["--testbed", "nope"])


def test_tiny_train_on_the_reasoning_variant(tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--testbed", "reasoning", "--out", str(out), "--no-progress", "--steps", "3",
            "--set", f"testbed.cache_dir={tmp_path / 'cache'}"]
    sets = {"prompts_per_step": 4, "group_size": 4, "eval_every": 0, "eval_problems": 8, "eval_samples": 2,
            "checkpoint_every": 0, "lr": 3e-3, "replay.warmup_steps": 1, **TINY_REASONING}
    for k, v in sets.items():
        argv += ["--set", f"{k}={json.dumps(v)}"]
    assert main(argv) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["testbed_preset"] == "reasoning" and saved["testbed"]["task"] == "running_sum"
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    evals = read_jsonl(out / "evals.jsonl")
    assert evals and all("len_correct" in e and "len_incorrect" in e for e in evals)
