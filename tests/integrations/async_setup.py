"""One `ReplayAsyncGRPOTrainer` (or plain `AsyncGRPOTrainer`) run on CPU for the async tests: the tiny Qwen2 and char
tokenizer of test_trl.py, the in-process rollout worker generating with a copy of the policy, the weight copy."""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

from test_trl import make_dataset, make_model, make_tokenizer, reward_fn  # noqa: E402,F401


def reward_some_flat(prompts, completions, **kwargs):
    """Every group of a 4-character prompt scores 1.0 (zero variance); the others as test_trl's reward_fn."""
    return [1.0 if len(p) == 4 else float(hashlib.md5(c.encode()).digest()[0] % 3) / 2.0
            for p, c in zip(prompts, completions)]


def async_kwargs(output_dir, **kw):
    from grpo_replay.trainer.trl.backend import no_activation_checkpointing

    base = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, **no_activation_checkpointing(),
        per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4, max_completion_length=6,
        max_steps=5, learning_rate=1e-2, report_to="none", save_strategy="no", logging_steps=1, seed=0,
        disable_tqdm=True, token_budget=0, replay_warmup_steps=1,
    )
    base.update(kw)
    return base


def make_async_trainer(tmp_path, plain=False, reward=reward_fn, ahead=1, worker_cls=None, **kw):
    """A trainer whose rollout worker generates with its own copy of the policy (synced by weight copy)."""
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from grpo_replay.integrations.trl import ReplayAsyncGRPOConfig, ReplayAsyncGRPOTrainer
    from grpo_replay.integrations.trl.async_local import CopyWeightTransfer, InProcessRolloutWorker, enable_cpu_async_grpo

    enable_cpu_async_grpo()
    model_dir = Path(tmp_path) / "model"
    if not model_dir.exists():
        make_model(0).save_pretrained(model_dir)
    kwargs = async_kwargs(Path(tmp_path) / "out", **kw)
    if plain:
        args = AsyncGRPOConfig(**{k: v for k, v in kwargs.items() if not k.startswith("replay_")})
    else:
        args = ReplayAsyncGRPOConfig(**kwargs)
    tok, copy = make_tokenizer(), make_model(1)  # the copy's own init is overwritten by the first weight sync
    worker = (worker_cls or InProcessRolloutWorker)(
        copy, tok, make_dataset(), reward, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, seed=args.seed, ahead=ahead)
    cls = AsyncGRPOTrainer if plain else ReplayAsyncGRPOTrainer
    trainer = cls(model=str(model_dir), reward_funcs=reward, args=args, train_dataset=make_dataset(),
                  processing_class=tok, rollout_worker=worker, weight_transfer=CopyWeightTransfer(copy))
    if not plain:
        trainer.replay_keep_samples = True
    return trainer


def params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
