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


def test_a_vllm_run_evaluates_through_its_engine(tiny_overrides, tmp_path, monkeypatch):
    """generator=vllm: the held-out evaluation samples in the run's engine (whose KV cache the memory estimate
    places in vLLM's share), never through transformers' generate on the training model, and each evaluation call
    carries a seed of its own, so the engine's training seeds do not depend on evaluating. A transformers
    generator stands in for the engine."""
    from grpo_replay.generation import vllm
    from grpo_replay.trainer import evaluation

    calls = []

    class Engine(TransformersGenerator):
        def sample(self, prompts, group_size, max_new_tokens, temperature, seed=None):
            calls.append((len(prompts), group_size, temperature, seed))
            return super().sample(prompts, group_size, max_new_tokens, temperature, seed=seed)

    monkeypatch.setattr(vllm.VLLMGenerator, "colocated",
                        classmethod(lambda cls, policy, tokenizer, **kw: Engine(policy, tokenizer)))
    monkeypatch.setattr(evaluation, "sample_groups",
                        lambda *a, **k: pytest.fail("the evaluation bypassed the run's generator"))
    cfg = resolve({**tiny_overrides, "steps": 1, "eval_every": 0, "checkpoint_every": 0, "generator": "vllm",
                   "eval_problems": 3, "eval_samples": 2, "out_dir": str(tmp_path / "run")})
    loop.train(cfg)
    evals = [c for c in calls if c[3] is not None]
    training = [c for c in calls if c[3] is None]
    assert len(training) == 1 and training[0][1] == cfg.group_size
    # two evaluations (start, end), each a sampled call (3 problems x 2) and a greedy one (temperature 0)
    assert [(n, g, t) for n, g, t, _ in evals] == [(3, 2, cfg.temperature), (3, 1, 0.0)] * 2
    assert evals[0][3] == evals[2][3] != evals[1][3]  # the same seeds at every evaluation
