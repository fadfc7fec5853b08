"""What was asked is what runs, however a setting arrives: a preset on the command line over a config file's keys
(one precedence rule, `train_config.resolve`), an empty value (an unset shell variable) refused rather than read as
null or as "not given", and a `compare --set` of a key compare sets per run refused rather than dropped."""
import argparse
import json

import pytest
import yaml
from helpers import refused

from grpo_replay.errors import ConfigError
from grpo_replay.app import configio
from grpo_replay.app.data import load_problems
from grpo_replay.cli import main
from grpo_replay.cli import train as command
from grpo_replay.config import ReplayConfig
from grpo_replay.tasks.testbed.testbed_config import TestbedConfig
from grpo_replay.trainer.train_config import TrainConfig, resolve


def _cli_config(*argv: str) -> TrainConfig:
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    return command.config_from_args(p.parse_args(list(argv)))


@pytest.fixture
def saved_yaml(tmp_path):
    """A config file as every run's config.yaml holds it: every key written out, the paper's replay values."""
    path = tmp_path / "my.yaml"
    path.write_text(TrainConfig().to_yaml())
    return path


# --- a preset on the command line over a file ------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["grpo", "uniform_pool", "sigma_pool"])
def test_a_command_line_preset_sets_its_fields_over_a_saved_config_file(saved_yaml, preset):
    cfg = _cli_config("--config", str(saved_yaml), "--preset", preset)
    assert cfg.preset == preset
    assert cfg.replay == ReplayConfig.from_preset(preset)  # not the file's replay_ratio 0.5 / composition / priority


def test_keys_at_the_presets_layer_or_above_still_win(saved_yaml, tmp_path):
    cfg = _cli_config("--config", str(saved_yaml), "--preset", "grpo", "--set", "replay.tau_max=3")
    assert cfg.replay == ReplayConfig.grpo(tau_max=3)
    # within one file, as a saved config.yaml: its replay keys are what the run had
    f = tmp_path / "f.yaml"
    f.write_text(yaml.safe_dump({"preset": "grpo", "replay": {"replay_ratio": 0.25}}))
    assert resolve(yaml_path=str(f)).replay == ReplayConfig.grpo(replay_ratio=0.25)
    # a file's keys that no preset sets are kept under a command-line preset
    f.write_text(yaml.safe_dump({"replay": {"tau_max": 4, "warmup_steps": 1}}))
    assert _cli_config("--config", str(f), "--preset", "grpo").replay == ReplayConfig.grpo(tau_max=4, warmup_steps=1)


@pytest.mark.parametrize("testbed", ["small", "large", "reasoning"])
def test_a_command_line_testbed_sets_its_fields_over_a_saved_config_file(saved_yaml, testbed):
    cfg = _cli_config("--config", str(saved_yaml), "--testbed", testbed)
    assert cfg.testbed == TestbedConfig.named(testbed)  # not the file's default-width model (or refused for reasoning)


def test_a_file_made_with_a_named_testbed_goes_back_to_the_default_under_testbed_default(tmp_path):
    f = tmp_path / "large.yaml"
    f.write_text(resolve({"testbed_preset": "large"}).to_yaml())
    assert _cli_config("--config", str(f), "--testbed", "default").testbed == TestbedConfig()


# --- empty values --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["replay.tau_max", "replay.max_uses", "replay.age_decay", "replay.capacity", "steps"])
def test_an_empty_set_value_is_refused_not_null(key, tmp_path, capsys):
    out = tmp_path / "run"
    refused(["train", "--out", str(out), "--set", f"{key}="], out, capsys, f"empty value for {key}", f"{key}=null")


@pytest.mark.parametrize("argv, field", [
    (["--model", ""], "model"), (["--data", " "], "data"), (["--set", "testbed.cache_dir="], "testbed.cache_dir"),
])
def test_an_empty_path_or_name_is_refused_not_taken_as_unset(argv, field, tmp_path, capsys):
    out = tmp_path / "run"
    refused(["train", "--out", str(out), *argv], out, capsys, f"empty value for {field}")


def test_an_empty_value_in_a_config_file_is_refused_null_is_not(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text("steps: 2\nreplay:\n  tau_max:\n")
    out = tmp_path / "run"
    refused(["train", "--config", str(f), "--out", str(out)], out, capsys, "empty value for 'tau_max' (line 3)")
    f.write_text("steps: 2\nreplay:\n  tau_max: null\n")
    assert resolve(yaml_path=str(f)).replay.tau_max is None


@pytest.mark.parametrize("argv", [
    ["eval", "--model", "m", "--out", ""], ["eval", "--model", ""], ["compare", "--out", ""],
    ["compare", "--report-dir", ""], ["compare", "--cache-dir", " "],
])
def test_an_empty_flag_value_of_eval_and_compare_is_refused(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv + ["--dry-run"] if argv[0] == "compare" else argv)
    assert e.value.code == 2
    assert "empty value" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_parse_sets_keeps_null_and_quoted_empty_strings_apart():
    assert configio.parse_sets(["replay.tau_max=null"]) == {"replay.tau_max": None}
    with pytest.raises(ConfigError, match="empty value for replay.tau_max"):
        configio.parse_sets(["replay.tau_max= "])


# --- text keys and paths -------------------------------------------------------------------------------------------
def test_a_text_key_keeps_its_text_and_a_path_expands_home_from_set_and_from_a_file(tiny_overrides, tmp_path, monkeypatch):
    """`007` is a directory name, not the number 7, and `~` is the home directory, not a folder named `~`: from
    --set (which no shell expands after `=`) and from a config file alike."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    sets = [a for k, v in tiny_overrides.items() if k != "progress" for a in ("--set", f"{k}={v if isinstance(v, str) else json.dumps(v)}")]
    assert main(["train", "--no-progress", *sets, "--set", "out_dir=~/007"]) == 0
    f = tmp_path / "c.yaml"
    f.write_text("out_dir: ~/0_8\n")
    assert main(["train", "--no-progress", "--config", str(f), *sets]) == 0
    assert (home / "007" / "summary.json").is_file() and (home / "0_8" / "summary.json").is_file()
    assert yaml.safe_load((home / "007" / "config.yaml").read_text())["out_dir"] == "~/007"
    assert list(cwd.iterdir()) == []  # no `~`, no `7`, no `8`
    (home / "d.jsonl").write_text('{"problem": "1+1=", "answer": "2"}\n')
    assert len(load_problems("~/d.jsonl")) == 1  # data and heldout_data are read there
    # every key typed text keeps what was written; the other keys still read numbers and booleans
    f.write_text("out_dir: 1.50\ntestbed:\n  cache_dir: 0x10\nsteps: 010\ndynamic_sampling: yes\nreport_to: [none]\n")
    cfg = resolve(yaml_path=str(f))
    assert (cfg.out_dir, cfg.testbed.cache_dir, cfg.steps, cfg.dynamic_sampling) == ("1.50", "0x10", 10, True)
    assert resolve(configio.parse_sets(["data=1e3", "model=true", "reward=math"])).model == "true"
    assert resolve(configio.parse_sets(["data=1e3", "model=null", "reward=math", "heldout_data=.5"])).heldout_data == ".5"


# --- compare: keys it sets per run ---------------------------------------------------------------------------
@pytest.mark.parametrize("item, flag", [
    ("seed=5", "--first-seed"), ("testbed.seed=5", "--first-seed"), ("out_dir=X", "--out"),
    ("progress=true", "--no-progress"), ("testbed.cache_dir=/tmp/x", "--cache-dir"),
    ("preset=grpo", "the arm 'grpo'"), ("replay.replay_ratio=0.3", "the preset of the arm 'grpo'"),
    ("replay.tau_max=3", "the arm 'tau2'"),
])
def test_compare_refuses_a_set_of_a_key_it_sets_per_run(item, flag, tmp_path, capsys):
    out = tmp_path / "c"
    refused(["compare", "--quick", "--out", str(out), "--dry-run", "--set", item], out, capsys,
            f"--set {item.split('=')[0]}=... is set per run by {flag}")


def test_compare_takes_a_set_no_arm_changes(tmp_path, capsys):
    """Keys no planned arm sets still reach every run: tau_max without the tau arms, prompts_per_step (the
    compute-matched arm scales it)."""
    argv = ["compare", "--quick", "--out", str(tmp_path / "c"), "--dry-run", "--comparisons", "main,compute"]
    assert main([*argv, "--set", "replay.tau_max=3", "--set", "prompts_per_step=4"]) == 0
    planned = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out != planned  # the run directories' config hashes changed


def test_compare_keeps_a_set_over_an_arms_own_schedule_and_says_so(tmp_path, capsys):
    """The DAPO arm evaluates on its own schedule (eval_every, a key a resume may change): a --set eval_every
    reaches the other arms and a note names the arm that keeps its own; an arm's training setting is refused."""
    argv = ["compare", "--comparisons", "alternatives", "--seeds", "1", "--out", str(tmp_path / "c"), "--dry-run"]
    assert main([*argv, "--set", "eval_every=50"]) == 0
    assert "note: --set eval_every applies to every arm but dapo (eval_every=10)" in capsys.readouterr().err
    refused([*argv, "--set", "update_epochs=3"], tmp_path / "c", capsys,
            "--set update_epochs=... is set per run by the arm 'grpo_mu2'")
