"""Refuse training half-precision weights that have no float32 master copy at a learning rate whose updates round
away.

TRL's `AsyncGRPOTrainer` trains the weights in the dtype they were loaded in (its `dtype` field), and so does
`GRPOTrainer` given a model object (transformers 5 loads Qwen3 in bfloat16 by default) or `model_init_kwargs` with a
dtype. `bf16: true` only turns on autocast; the optimizer steps the stored bfloat16 weights themselves. A float32
master copy exists in two cases: FSDP2 with mixed precision on (accelerate upcasts the trainable parameters to
float32 before sharding) and DeepSpeed (its bf16/ZeRO optimizers step float32 copies).
Otherwise (one process, DDP) an AdamW step, about `learning_rate` in size, is lost whenever it is below half the
spacing of the weight's dtype at that weight. The loss and the replay metrics are logged as usual while the policy
barely moves.
"""
from __future__ import annotations

import torch

from ...errors import ConfigError

LOW_PRECISION = (torch.bfloat16, torch.float16)
# Refused when more than this share of the trainable weights cannot change by one step of `learning_rate`.
FROZEN_SHARE_LIMIT = 0.5


def frozen_share(params, learning_rate: float) -> float:
    """Share of the trainable low-precision elements that a step of size `learning_rate` cannot change.

    For w in [2^e, 2^(e+1)) the dtype's spacing is 2^e * eps > |w| * eps / 2, so a step below |w| * eps / 4 (half the
    spacing) rounds back to w under round-to-nearest."""
    frozen = total = 0
    for p in params:
        if not p.requires_grad:
            continue
        total += p.numel()
        if p.dtype in LOW_PRECISION:
            eps = torch.finfo(p.dtype).eps
            frozen += int((p.detach().abs().float() * (eps / 4) > learning_rate).sum())
    return frozen / max(total, 1)


def check_trainer_master_weights(trainer) -> None:
    """`check_master_weights` for a constructed TRL trainer (its model, learning rate and accelerator)."""
    from accelerate.utils import DistributedType

    acc = trainer.accelerator
    check_master_weights(trainer.model, trainer.args.learning_rate, acc.mixed_precision, acc.is_fsdp2,
                         deepspeed=acc.distributed_type == DistributedType.DEEPSPEED, trainer=type(trainer).__name__)


def check_master_weights(model: torch.nn.Module, learning_rate: float, mixed_precision: str, fsdp2: bool,
                         deepspeed: bool = False, trainer: str = "AsyncGRPOTrainer") -> None:
    """ConfigError when the trainable weights are bfloat16/float16 with no float32 master copy and most of them cannot
    move by a step of `learning_rate`."""
    if (fsdp2 and mixed_precision != "no") or deepspeed:
        return  # accelerate's fsdp2_prepare_model upcasts the trainable parameters; DeepSpeed steps float32 copies
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()
                     if p.requires_grad and p.dtype in LOW_PRECISION})
    if not dtypes:
        return
    share = frozen_share(model.parameters(), learning_rate)
    if share > FROZEN_SHARE_LIMIT:
        raise ConfigError(
            f"dtype={'/'.join(dtypes)} with learning_rate={learning_rate:g}: the trainable weights are "
            f"{'/'.join(dtypes)} with no float32 master copy ({trainer} steps the loaded weights; "
            f"mixed_precision={mixed_precision!r}, FSDP2={fsdp2}), and a step of that size rounds away on "
            f"{share:.0%} of them, so the policy would barely move while the run logs as usual. allowed: "
            "dtype: float32 (float32 weights: model_init_kwargs {dtype: float32}, or a model loaded with "
            "dtype=torch.float32; with bf16: true the forward and backward still run in bfloat16 autocast), or FSDP2 "
            "with mixed precision or DeepSpeed (float32 master weights), or a learning_rate at which most weights "
            "can change"
        )
