"""`grpo-replay train --backend trl --model ... --reward math`: a real model through `ReplayGRPOTrainer`.

The same `TrainConfig`, model loading (GGUF included), `MathTask` prompts and held-out evaluation (start and
end) as the built-in trainer. TRL receives each problem as a one-message conversation and applies the
tokenizer's chat template itself, which yields exactly the built-in trainer's prompt text. Every setting maps as
`trl_settings.KEYS` says (checked by `trl_settings.check` before this runs). A TRL checkpoint (model, optimizer,
replay buffer) is written every `checkpoint_every` steps and an existing one in the run directory is resumed;
the trained model is saved to `<run dir>/final`.
"""
from __future__ import annotations

import json
from typing import Any

from . import trl_settings
from .train_config import TrainConfig


def train_real_with_trl(cfg: TrainConfig) -> dict[str, Any]:
    trl_settings.check(cfg)
    import torch
    from datasets import Dataset

    from ..integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer
    from .evaluation import evaluate
    from .loop import EVAL_SEED_OFFSET, HELDOUT_SEED, _SafeRewardTask, _device
    from .rewards import RewardScorer
    from .setup import build_policy
    from .trl_backend import last_checkpoint, start_evals

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

    args = ReplayGRPOConfig(**{**trl_settings.trl_kwargs(cfg), "output_dir": str(run_dir),
                                 "use_cpu": device.type == "cpu", "bf16": False, "gradient_checkpointing": False})
    model.train()
    callbacks = trl_settings.callbacks(cfg, lambda m: evaluate(m, tokenizer, eval_task, heldout, **eval_kw))
    trainer = ReplayGRPOTrainer(model=model, reward_funcs=math_reward, args=args, train_dataset=dataset,
                                processing_class=tokenizer, callbacks=callbacks)
    resume = last_checkpoint(run_dir)
    # The held-out evaluations in the built-in trainer's evals.jsonl form, so `grpo-replay compare`, `plot` and the
    # report read a TRL run like a built-in one.
    start_evals(run_dir, resume, start)
    trainer.train(resume_from_checkpoint=resume)
    trl_settings.raise_if_stopped(cfg, trainer)
    trainer.save_model(str(run_dir / "final"))
    end = evaluate(trainer.model, tokenizer, eval_task, heldout, **eval_kw)
    (run_dir / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1, default=str))
    generated = cfg.steps * cfg.prompts_per_step * cfg.group_size
    trl_settings.append_eval(run_dir, cfg.steps, cfg, end)
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

