"""Run the embedded CPU testbed (synthetic addition, tiny warm-started model) through TRL's GRPOTrainer with
replay: the `grpo-replay train --backend trl` path."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np


def train_testbed_with_trl(
    output_dir: str | os.PathLike,
    preset: str = "paper",
    *,
    replay_overrides: Optional[dict[str, Any]] = None,
    testbed_config: Any = None,
    max_steps: int = 50,
    prompts_per_step: int = 8,
    num_generations: int = 8,
    learning_rate: float = 1e-4,
    seed: int = 0,
    num_train_problems: int = 4096,
    trl_overrides: Optional[dict[str, Any]] = None,
    progress: bool = True,
    reward_timeout: Optional[float] = None,
    callbacks: Optional[list] = None,
    resume_from_checkpoint: Optional[str] = None,
) -> dict[str, Any]:
    """Train the testbed model with `ReplayGRPOTrainer` for `max_steps` optimizer steps.

    preset: replay preset (paper | grpo | uniform_pool | sigma_pool); replay_overrides: `ReplayConfig` fields
    without the `replay_` prefix (e.g. {"tau_max": 5, "warmup_steps": 2}); testbed_config: a `TestbedConfig`
    (default: `TestbedConfig()`; its warm start is loaded from the cache or trained first); prompts_per_step x
    num_generations fresh rollouts per step; trl_overrides: any further `ReplayGRPOConfig` fields (they win);
    reward_timeout: seconds a reward call may take (scored 0 after; None = no limit); callbacks: TrainerCallbacks;
    resume_from_checkpoint: a TRL checkpoint to resume.
    Writes `<output_dir>/trl_summary.json` and returns {"log_history", "replay_history", "final_metrics",
    "output_dir"}; the trained model is saved to `<output_dir>/final`.
    """
    from ...tasks.testbed import TestbedConfig, TestbedTask, warm_start
    from . import ReplayGRPOConfig, ReplayGRPOTrainer
    from .replay_grpo_config import trl_replay_kwargs

    cfg = testbed_config or TestbedConfig()
    model, tokenizer, _info = warm_start(cfg, progress=progress)
    model.train()
    task = TestbedTask(cfg, tokenizer)
    problems = task.sample_problems(np.random.default_rng(seed), num_train_problems)
    dataset, testbed_reward = _dataset_and_reward(task, problems, reward_timeout)
    kwargs: dict[str, Any] = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=prompts_per_step * num_generations,
        num_generations=num_generations,
        max_completion_length=cfg.max_new_tokens,
        max_steps=max_steps,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        temperature=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=seed,
        disable_tqdm=not progress,
        replay_preset=preset,
        **trl_replay_kwargs(replay_overrides or {}),
    )
    kwargs.update(trl_overrides or {})
    args = ReplayGRPOConfig(**kwargs)
    trainer = ReplayGRPOTrainer(
        model=model, reward_funcs=testbed_reward, args=args, train_dataset=dataset, processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    final = Path(output_dir) / "final"
    trainer.save_model(str(final))
    result = {
        "output_dir": str(output_dir),
        "trainer": trainer,
        "log_history": trainer.state.log_history,
        "replay_history": [{k: v for k, v in h.items() if k != "replay_completion_ids"} for h in trainer.replay_history],
        "final_metrics": trainer.state.log_history[-1] if trainer.state.log_history else {},
    }
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    (Path(output_dir) / "trl_summary.json").write_text(
        json.dumps({k: v for k, v in result.items() if k != "trainer"}, indent=1, default=str))
    return result


def _dataset_and_reward(task, problems: list, timeout: Optional[float] = None) -> tuple[Any, Callable[..., list[float]]]:
    """The problems as a TRL dataset (each problem's fields as columns) and the reward function that reads them
    back (TRL passes every dataset column to the reward function by name)."""
    from datasets import Dataset

    from ...tasks.testbed import TestbedProblem

    dataset = Dataset.from_dict(
        {
            "prompt": [p.prompt for p in problems],
            "problem_id": [p.id for p in problems],
            "answer": [p.answer for p in problems],
            "difficulty": [p.difficulty for p in problems],
        }
    )

    scorer = None
    if timeout is not None:
        from ...trainer.rewards import RewardScorer

        scorer = RewardScorer(task.reward, timeout)

    def testbed_reward(completions, prompts, problem_id, answer, difficulty, **_: Any) -> list[float]:
        rows = [TestbedProblem(id=i, prompt=p, answer=a, difficulty=d)
                for p, i, a, d in zip(prompts, problem_id, answer, difficulty)]
        if scorer is not None:
            return scorer(list(completions), rows)[0]
        return [task.reward(c, row) for c, row in zip(completions, rows)]

    return dataset, testbed_reward
