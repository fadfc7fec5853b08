"""ReplayGRPOTrainer (sync) refuses bfloat16 weights with no float32 master copy at a learning rate whose steps round
away, as ReplayAsyncGRPOTrainer does: a bfloat16 model object (transformers 5 loads Qwen3 so by default) or
`model_init_kwargs` dtype bfloat16. float32 weights at the same rate, and bfloat16 at a rate that moves them, train."""
from __future__ import annotations

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from test_trl import make_model, make_trainer  # noqa: E402

from grpo_replay.errors import ConfigError  # noqa: E402


def test_a_bf16_model_at_an_rl_learning_rate_is_refused_before_training(tmp_path):
    with pytest.raises(ConfigError, match=r"dtype=bfloat16 with learning_rate=1e-06.*ReplayGRPOTrainer steps the "
                                          r"loaded weights.*allowed: dtype: float32"):
        make_trainer(tmp_path / "bf16", model=make_model(0).to(torch.bfloat16), learning_rate=1e-6)
    assert not (tmp_path / "bf16").exists() or not any((tmp_path / "bf16").glob("checkpoint-*"))


def test_float32_weights_and_a_rate_that_moves_bf16_weights_are_accepted(tmp_path):
    fp32 = make_trainer(tmp_path / "fp32", learning_rate=1e-6)
    assert {p.dtype for p in fp32.model.parameters()} == {torch.float32}
    bf16 = make_trainer(tmp_path / "lr", model=make_model(0).to(torch.bfloat16), learning_rate=1e-2)
    assert bf16.model.dtype == torch.bfloat16


def test_model_init_kwargs_dtype_bfloat16_is_refused(tmp_path):
    """A model given by path, loaded by TRL with model_init_kwargs' dtype."""
    path = tmp_path / "model"
    make_model(0).save_pretrained(path)
    with pytest.raises(ConfigError, match="no float32 master copy"):
        make_trainer(tmp_path / "out", model=str(path), learning_rate=1e-6, model_init_kwargs={"dtype": "bfloat16"})
