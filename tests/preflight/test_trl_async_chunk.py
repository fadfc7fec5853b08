"""The async preflight's "replay rows per step" line is the composer's own: the chunk size from the function the
trainer sizes its composer with (`async_composer.chunk_size`), the counts from the check the trainer runs
(`check_chunk`), worded by `chunk_holds`, so a restated formula beside them cannot drift from the run."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations"))

from grpo_replay.cli.preflight import resolve  # noqa: E402
from grpo_replay.integrations.trl import async_composer  # noqa: E402
from grpo_replay.preflight.host import Host  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CPU = Host(gpus=0, gpu_memory=0, driver=None, torch="2.13.0+cpu", torch_cuda=None, vllm=None)
# One process (a python launch): 4 samples x 3 micro-batches = a chunk of 12, groups of 4.
BATCH = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 3, "num_generations": 4}
LAUNCH = ["python", str(ROOT / "examples/trl/train_qwen3_math_async_replay.py"), "--config",
          str(ROOT / "examples/trl/qwen3_0.6b_math_async_replay.yaml"),
          *[w for k, v in BATCH.items() for w in (f"--{k}", str(v))]]


def step_line(fill: bool) -> str:
    report = resolve([*LAUNCH, "--replay_fill_filtered", str(fill).lower()], CPU, None)
    assert not report.refusals, report.render()
    [line] = report.sections["replay rows per step"]
    return line


@pytest.mark.parametrize("fill", [False, True])
def test_the_preflight_reports_the_chunk_size_the_trainer_computes(monkeypatch, tmp_path, fill):
    """Double the shared function's chunk: the preflight's figures follow it (a restated formula would not)."""
    monkeypatch.chdir(tmp_path)
    real = async_composer.chunk_size
    monkeypatch.setattr(async_composer, "chunk_size", lambda args, processes: 2 * real(args, processes))
    line = step_line(fill)
    assert line.startswith("24 samples per optimizer step: "), line
    if fill:  # every fresh sample of the doubled chunk may be replaced
        assert "24 fresh, of which up to 24 (every zero-variance one)" in line, line


@pytest.mark.parametrize("fill", [False, True])
def test_the_preflight_line_is_what_a_real_async_trainer_composes(monkeypatch, tmp_path, fill):
    """A tiny ReplayAsyncGRPOTrainer with the launch's batch and replay settings: its composer's chunk and plan are
    the ones the preflight's line states."""
    from async_setup import make_async_trainer

    monkeypatch.chdir(tmp_path)
    line = step_line(fill)
    trainer = make_async_trainer(tmp_path, replay_preset="paper", replay_fill_filtered=fill, **BATCH)
    composer = trainer.replay_composer
    assert composer.chunk_size == 12 == int(line.split()[0]), line
    assert line == async_composer.chunk_holds(trainer.replay_config, composer.plan)
