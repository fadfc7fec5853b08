"""The trainer closes its generator when the run ends, finished or failed: a vLLM engine holds GPU memory and
process groups that the next run in the process would collide with. The transformers generator stands in for the
vLLM one (which needs a GPU), given a recording close()."""
import pytest

from grpo_replay.generation.transformers import TransformersGenerator
from grpo_replay.trainer import loop
from grpo_replay.trainer.train_config import resolve


@pytest.fixture
def closes(monkeypatch):
    calls = []
    monkeypatch.setattr(TransformersGenerator, "close", lambda self: calls.append(self), raising=False)
    return calls


def test_closed_after_a_finished_run(tiny_overrides, tmp_path, closes):
    loop.train(resolve({**tiny_overrides, "steps": 1, "eval_every": 0, "checkpoint_every": 0,
                        "out_dir": str(tmp_path / "run")}))
    assert len(closes) == 1


def test_closed_after_a_failed_step(tiny_overrides, tmp_path, closes, monkeypatch):
    def boom(run, t):
        raise RuntimeError("step failed")

    monkeypatch.setattr(loop, "step", boom)
    with pytest.raises(RuntimeError, match="step failed"):
        loop.train(resolve({**tiny_overrides, "steps": 1, "eval_every": 0, "checkpoint_every": 0,
                            "out_dir": str(tmp_path / "run")}))
    assert len(closes) == 1
