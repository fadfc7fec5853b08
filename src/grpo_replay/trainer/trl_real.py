"""`grpo-replay train --backend trl --model ... --reward math`: a real model through `ReplayGRPOTrainer`.

The same `TrainConfig`, model loading (GGUF included), `MathTask` prompts and held-out evaluation (start and
end) as the built-in trainer. TRL receives each problem as a one-message conversation and applies the
tokenizer's chat template itself, which yields exactly the built-in trainer's prompt text. Mapping: prompts_per_step
x group_size rows per step (one generation, one optimizer step), lr constant after lr_warmup_steps, PPO-clip
eps_low/eps_high, TRL's `dapo` loss (token mean over the batch, like `loss.aggregation=token_mean`), no KL.
A TRL checkpoint (model, optimizer, replay buffer) is written every `checkpoint_every` steps and an existing
one in the run directory is resumed; the trained model is saved to `<run dir>/final`.
"""
from __future__ import annotations

import json
from typing import Any

from ..app.configio import ConfigError
from .train_config import TrainConfig


def train_real_with_trl(cfg: TrainConfig) -> dict[str, Any]:
    if cfg.micro_batch_size:
        raise ConfigError("TrainConfig.micro_batch_size is not supported with backend='trl'; allowed: 0 (whole batch)")
    if cfg.generator != "transformers":
        raise ConfigError("TrainConfig.generator with backend='trl' must be 'transformers' (use TRL's own vLLM options)")
    import torch
    from datasets import Dataset
    from transformers.trainer_utils import get_last_checkpoint

    from ..integrations.trl import ReplayGRPOTrainer
    from .evaluation import evaluate
    from .loop import EVAL_SEED_OFFSET, HELDOUT_SEED, _SafeRewardTask, _device
    from .rewards import RewardScorer
    from .setup import build_policy

    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    device = _device(cfg.device)
    model, tokenizer, task, setup_info = build_policy(cfg, device)
    scorer = RewardScorer(task.reward, cfg.reward_timeout)
    eval_task = _SafeRewardTask(task, scorer)
    heldout = task.heldout(cfg.eval_problems, seed=HELDOUT_SEED)
    max_new = cfg.completion_budget()
    eval_kw = dict(n_samples=cfg.eval_samples, max_new_tokens=max_new, temperature=cfg.temperature, seed=cfg.seed + EVAL_SEED_OFFSET)
    start = evaluate(model, tokenizer, eval_task, heldout, **eval_kw)

    by_id = {p.id: p for p in task.train}
    prompts = [[{"role": "user", "content": p.message}] if task.use_chat_template else p.prompt for p in task.train]
    dataset = Dataset.from_dict({"prompt": prompts, "problem_id": [p.id for p in task.train]})

    def math_reward(completions, problem_id, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return scorer(texts, [by_id[i] for i in problem_id])[0]

    args = _trl_args(cfg, run_dir, use_cpu=device.type == "cpu")
    model.train()
    trainer = ReplayGRPOTrainer(model=model, reward_funcs=math_reward, args=args, train_dataset=dataset, processing_class=tokenizer)
    resume = get_last_checkpoint(str(run_dir)) if any(run_dir.glob("checkpoint-*")) else None
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(str(run_dir / "final"))
    end = evaluate(trainer.model, tokenizer, eval_task, heldout, **eval_kw)
    (run_dir / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1, default=str))
    # The held-out evaluations in the built-in trainer's evals.jsonl form (start and end), so `grpo-replay compare`,
    # `plot` and the report read a TRL run like a built-in one.
    generated = cfg.steps * cfg.prompts_per_step * cfg.group_size
    (run_dir / "evals.jsonl").write_text(
        json.dumps({"step": 0, "generated": 0, **start}) + "\n"
        + json.dumps({"step": cfg.steps, "generated": generated, **end}) + "\n"
    )
    summary = {
        "backend": "trl",
        "preset": cfg.preset,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "generated_rollouts": generated,
        "heldout_acc_sampled": {"start": start["acc_sampled"], "end": end["acc_sampled"]},
        "heldout_acc_greedy": {"start": start["acc_greedy"], "end": end["acc_greedy"]},
        "final_eval": {k: v for k, v in end.items() if k != "counts"},
        "replay_rows_total": sum(h.get("replay_rows", 0) for h in trainer.replay_history),
        "reward_errors": scorer.errors,
        "reward_timeouts": scorer.timeouts,
        "resumed_from": resume,
        "setup": setup_info,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _trl_args(cfg: TrainConfig, run_dir, use_cpu: bool):
    """The `ReplayGRPOConfig` of the run: the mapping of the module docstring, checkpoints every checkpoint_every."""
    from ..integrations.trl import ReplayGRPOConfig
    from ..integrations.trl.replay_grpo_config import trl_replay_kwargs

    return ReplayGRPOConfig(
        output_dir=str(run_dir),
        use_cpu=use_cpu,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.group_size,
        num_generations=cfg.group_size,
        max_completion_length=cfg.completion_budget(),
        max_steps=cfg.steps,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant_with_warmup" if cfg.lr_warmup_steps else "constant",
        warmup_steps=cfg.lr_warmup_steps,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        temperature=cfg.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=cfg.loss.eps_low,
        epsilon_high=cfg.loss.eps_high,
        loss_type="dapo",
        scale_rewards="group" if cfg.advantage_scale == "group" else "none",
        report_to="none",
        save_strategy="steps" if cfg.checkpoint_every else "no",
        save_steps=cfg.checkpoint_every or 500,
        save_total_limit=cfg.keep_checkpoints,
        logging_steps=1,
        seed=cfg.seed,
        disable_tqdm=not cfg.progress,
        replay_preset=cfg.preset,
        **trl_replay_kwargs(cfg.replay_overrides()),
    )
