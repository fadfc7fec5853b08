"""TrainConfig.precision: the built-in trainer's update runs under bf16 autocast on a GPU by default, with float32
weights, gradients and AdamW state (as TRL's bf16=True and verl's FSDP mixed precision); float32 on a CPU."""
import types

import pytest
import torch

from grpo_replay.loss import LossConfig
from grpo_replay.trainer import memory, update as update_mod
from grpo_replay.trainer.train_config import check_machine, resolve
from helpers import make_batch


@pytest.mark.parametrize("precision,device,want", [
    ("auto", "cuda", "bf16"), ("auto", "cpu", "fp32"), ("fp32", "cuda", "fp32"), ("bf16", "cuda", "bf16"),
])
def test_precision_resolves_by_device(precision, device, want):
    assert memory.precision_of(types.SimpleNamespace(precision=precision), device) == want


def test_bf16_on_a_cpu_run_is_refused_naming_the_key():
    cfg = resolve({"precision": "bf16", "device": "cpu"})
    with pytest.raises(ValueError, match=r"TrainConfig.precision='bf16' needs a CUDA device.*allowed: auto, fp32"):
        check_machine(cfg)


def test_the_update_runs_under_autocast_and_keeps_float32_master_weights(monkeypatch):
    """With bf16 resolved (forced here on the CPU, whose autocast also has bf16), the model's matmuls see bf16
    inputs, the log-probs the loss reads are float32, and the parameters and their AdamW state stay float32."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    monkeypatch.setattr(update_mod, "precision_of", lambda cfg, device_type: "bf16")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1), dtype=torch.float32)
    seen = []
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    cfg = types.SimpleNamespace(update_epochs=1, micro_batch_size=None, temperature=1.0, max_grad_norm=1.0,
                                replay=types.SimpleNamespace(max_drift=None))
    stats = update_mod.update(model, opt, sched, make_batch(2, 4, seed=3), LossConfig(max_completion_length=7), cfg)
    assert seen and set(seen) == {torch.bfloat16}
    assert stats["fresh_logps"].dtype == torch.float32 and stats["finite"]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())
