"""ReplayAsyncGRPOTrainer refuses bfloat16 weights with no float32 master copy at a learning rate whose steps round
away; the async example trains float32 master weights."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
import yaml  # noqa: E402
from async_setup import make_async_trainer, make_model  # noqa: E402

from grpo_replay.errors import ConfigError  # noqa: E402
from grpo_replay.integrations.trl.master_weights import check_master_weights, frozen_share  # noqa: E402

ASYNC_YAML = Path(__file__).resolve().parents[2] / "examples/trl/qwen3_0.6b_math_async_replay.yaml"


def test_bf16_weights_at_a_tiny_learning_rate_are_refused_at_construction(tmp_path):
    with pytest.raises(ConfigError, match=r"dtype=bfloat16 with learning_rate=1e-06.*no float32 master copy.*"
                                          r"allowed: dtype: float32"):
        make_async_trainer(tmp_path, dtype="bfloat16", learning_rate=1e-6)
    assert not (tmp_path / "out" / "checkpoint-1").exists()
    # A step size that moves most bfloat16 weights is accepted; so is float32 at the tiny rate.
    assert make_async_trainer(tmp_path, dtype="bfloat16", learning_rate=1e-2).model.dtype == torch.bfloat16
    assert make_async_trainer(tmp_path, dtype="float32", learning_rate=1e-6).model.dtype == torch.float32


def test_the_async_example_trains_float32_master_weights(tmp_path):
    """The example's dtype and learning rate pass the check on the tiny model; its old bfloat16 dtype does not."""
    cfg = yaml.safe_load(ASYNC_YAML.read_text())
    assert cfg["dtype"] == "float32" and cfg["bf16"] is True  # float32 master weights, bfloat16 autocast
    trainer = make_async_trainer(tmp_path, dtype=cfg["dtype"], learning_rate=cfg["learning_rate"])
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    with pytest.raises(ConfigError, match="no float32 master copy"):
        make_async_trainer(tmp_path, dtype="bfloat16", learning_rate=cfg["learning_rate"])


def test_frozen_share_predicts_what_an_adamw_step_leaves_unchanged():
    """The refusal's premise, measured: one AdamW step of lr 1e-6 on bfloat16 weights changes at most the share of
    weights the bound does not call frozen (and almost none here); at float32 it changes nearly all."""
    torch.manual_seed(0)
    for dtype, lr in ((torch.bfloat16, 1e-6), (torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        model = make_model(0).to(dtype)
        before = [p.detach().clone() for p in model.parameters()]
        share = frozen_share(model.parameters(), lr)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
        changed = sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before))
        total = sum(b.numel() for b in before)
        assert changed / total <= 1 - share + 1e-9, (dtype, lr, changed / total, share)
        if dtype == torch.bfloat16 and lr == 1e-6:
            assert share > 0.9 and changed / total < 0.1
        else:
            assert share < 0.1 and changed / total > 0.9


def test_fsdp2_with_mixed_precision_keeps_a_master_copy():
    model = make_model(0).to(torch.bfloat16)
    check_master_weights(model, 1e-6, mixed_precision="bf16", fsdp2=True)  # accelerate upcasts: accepted
    with pytest.raises(ConfigError, match="FSDP2=False"):
        check_master_weights(model, 1e-6, mixed_precision="bf16", fsdp2=False)
    with pytest.raises(ConfigError, match="mixed_precision='no', FSDP2=True"):
        check_master_weights(model, 1e-6, mixed_precision="no", fsdp2=True)
