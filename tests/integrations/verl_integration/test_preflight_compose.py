"""`grpo-replay preflight` of a verl launcher in the verl environment: the launcher's overrides (its bash run with
the recording python) are composed by Hydra and checked by the entry point's own `check_config`, and the report's
seeds and checkpoint folder are the composed config's."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("verl.protocol")
pytest.importorskip("hydra")

from grpo_replay.preflight.host import Host  # noqa: E402
from grpo_replay.preflight.verl_launch import captured_overrides, check_verl_overrides  # noqa: E402

CPU_HOST = Host(gpus=0, gpu_memory=0, driver=None, torch="2.11.0+cpu", torch_cuda=None, vllm=None)


def _overrides(tmp_path, *extra):
    (tmp_path / "train.parquet").touch()
    (tmp_path / "test.parquet").touch()
    env = {"MODEL": "Qwen/Qwen3-4B-Base", "DATA": str(tmp_path), "PRESET": "paper", "EXP": "qwen3-4b-paper-s0"}
    return captured_overrides([*(f"{k}={v}" for k, v in env.items()), "bash", "examples/verl/run_paper_single_node.sh",
                               *extra])


def test_the_single_node_launch_composes_and_passes(tmp_path, monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    report = check_verl_overrides(_overrides(tmp_path, "trainer.total_training_steps=300"), CPU_HOST, None, "verl")
    text = report.render()
    assert "composed by Hydra and accepted by the entry point's checks" in text, text
    assert "share 0.333 vs configured 0.333" in text and "qwen3-4b-paper-s0: a fresh run" in text
    assert not report.refusals, text


def test_a_setting_the_entry_point_refuses_is_a_refusal(tmp_path, monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    report = check_verl_overrides(_overrides(tmp_path, "replay.tau_max=-3"), CPU_HOST, None, "verl")
    assert report.refusals and "tau_max" in report.refusals[0].line(), report.render()
