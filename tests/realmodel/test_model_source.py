"""Naming a GGUF checkpoint (`--model FILE.gguf`, or a directory plus model_file) and the `word_sums` task: the
argument handling and its errors, without loading a real model (seconds)."""
from __future__ import annotations

import pytest

from grpo_replay.cli import main
from grpo_replay.errors import ConfigError
from grpo_replay.app.data import DataError
from grpo_replay.app.models import ModelSource, resolve_model
from grpo_replay.tasks.word_sums import parse_digits, word_sum_problems
from helpers import build_tiny_model


@pytest.fixture
def gguf_dir(tmp_path):
    pytest.importorskip("gguf")
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    return tmp_path


def test_resolve_gguf_file_and_directory_forms(gguf_dir):
    assert resolve_model(str(gguf_dir / "a.gguf")) == ModelSource(str(gguf_dir.resolve()), "a.gguf")
    assert resolve_model(str(gguf_dir), "a.gguf") == ModelSource(str(gguf_dir), "a.gguf")
    assert resolve_model(str(gguf_dir), "a.gguf").kwargs() == {"gguf_file": "a.gguf"}
    assert resolve_model(str(gguf_dir)).kwargs() == {}  # a regular checkpoint directory
    # dense float weights, never packed GGUF blocks (those cannot be trained)
    assert resolve_model(str(gguf_dir), "a.gguf").model_kwargs()["quantization_config"].dequantize is True
    assert resolve_model("org/name", "m.gguf") == ModelSource("org/name", "m.gguf")  # hub repo + file


def test_resolve_errors_name_the_field(gguf_dir):
    with pytest.raises(FileNotFoundError, match="model: GGUF file .*missing.gguf does not exist"):
        resolve_model(str(gguf_dir / "missing.gguf"))
    with pytest.raises(ValueError, match=r"model_file='w.bin' is invalid; allowed: a file name ending in .gguf"):
        resolve_model(str(gguf_dir), "w.bin")
    with pytest.raises(ValueError, match="allowed: a file name ending in .gguf"):
        resolve_model(str(gguf_dir), "sub/a.gguf")
    with pytest.raises(FileNotFoundError, match=r"b.gguf is not in .*GGUF files there: \['a.gguf'\]"):
        resolve_model(str(gguf_dir), "b.gguf")
    with pytest.raises(ValueError, match="names another one"):
        resolve_model(str(gguf_dir / "a.gguf"), "b.gguf")


def test_train_cli_rejects_a_bad_model_file_before_any_compute(tmp_path, capsys):
    model = build_tiny_model(tmp_path / "model")
    argv = ["train", "--reward", "math", "--model", str(model), "--data", "word_sums", "--out", str(tmp_path / "run"),
            "--no-progress", "--device", "cpu", "--set", "model_file=weights.bin"]
    assert main(argv) == 2
    assert "TrainConfig.model_file='weights.bin' is invalid; allowed: a file name ending in .gguf" in capsys.readouterr().err


def test_model_file_needs_model():
    from grpo_replay.trainer.train_config import resolve

    with pytest.raises(ConfigError, match="model_file"):
        resolve({"model_file": "a.gguf"})


def test_word_sums_items_and_spec_errors():
    assert parse_digits("word_sums") == (1, 2) and parse_digits("word_sums:1,3") == (1, 3)
    for bad in ("word_sums:", "word_sums:0", "word_sums:x", "word_sums:10"):
        with pytest.raises(DataError, match="allowed: word_sums or word_sums:D1,D2"):
            parse_digits(bad)
    items = word_sum_problems("word_sums", 6, seed=0)
    assert items == word_sum_problems("word_sums", 6, seed=0)  # deterministic
    for i, p in enumerate(items):
        a, b = (int(x) for x in p.problem.removeprefix("What is ").removesuffix("?").split(" + "))
        assert int(p.answer) == a + b and len(str(max(a, b))) == (1, 2)[i % 2]


def test_word_sums_task_prompts_and_reward(tmp_path):
    from transformers import AutoTokenizer

    from grpo_replay.tasks.math import MathTask

    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m"))
    task = MathTask(tok, "word_sums", n_heldout=8)
    assert len(task.train) == 4096 and len(task.held) == 8
    p = task.held[0]
    assert p.prompt == f"<|user|>{p.message}\n<|assistant|>" and p.message.startswith("What is ")  # no box instruction
    assert {q.difficulty for q in task.held} == {1, 2}
    task.reward("0", p)  # the first grade imports math-verify/sympy, which can exceed the grading timeout on a busy machine
    assert task.reward(f"The sum is {p.answer}.", p) == 1.0  # the final answer, no \boxed{} needed
    assert task.reward(f"\\boxed{{{p.answer}}}", p) == 1.0
    assert task.reward(f"The sum is {int(p.answer) + 1}.", p) == 0.0
    with pytest.raises(DataError):
        MathTask(tok, "word_sums:0")


def test_set_takes_scientific_notation_as_a_number():
    """`--set lr=1e-6` (the paper's learning rate, as the README writes it) was rejected: YAML 1.1 reads it as text."""
    import argparse

    from grpo_replay.cli import train as command

    p = argparse.ArgumentParser()
    command.add_arguments(p)
    args = p.parse_args(["--reward", "math", "--data", "word_sums", "--set", "lr=1e-6", "--set", "loss.eps_high=2.8E-1"])
    cfg = command.config_from_args(args)
    assert cfg.lr == 1e-6 and cfg.loss.eps_high == 0.28
    args = p.parse_args(["--set", "out_dir=runs/1e5"])
    assert command.config_from_args(args).out_dir == "runs/1e5"  # only a whole number in that form is converted


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("1", True), ("", True), ("yes", True)])
def test_the_gguf_cache_switch_takes_its_words_and_refuses_others(value, on, monkeypatch):
    from grpo_replay.app.models import gguf_cache_root

    monkeypatch.setenv("GRPO_REPLAY_GGUF_CACHE", value)
    assert (gguf_cache_root() is not None) == on
    monkeypatch.setenv("GRPO_REPLAY_GGUF_CACHE", "disable")  # not a word for off: refused, never read as on
    with pytest.raises(ConfigError, match="GRPO_REPLAY_GGUF_CACHE='disable' is invalid; allowed: 0, off"):
        gguf_cache_root()
