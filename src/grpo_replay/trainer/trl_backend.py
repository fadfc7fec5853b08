"""`grpo-replay train --backend trl`: the testbed through `ReplayGRPOTrainer`, evaluated like the built-in run
(a real model with `--reward math`: `trl_real.py`)."""
from __future__ import annotations

import json
from typing import Any

from .train_config import TrainConfig
from .rundir import claim


def train_with_trl(cfg: TrainConfig) -> dict[str, Any]:
    with claim(cfg) as run_dir:  # checked, locked for the run's life, config.yaml written
        if cfg.reward != "testbed":  # a real model and data set (GGUF or transformers checkpoint)
            from .trl_real import train_real_with_trl

            return train_real_with_trl(cfg)
        return _train(cfg, run_dir)


def train_testbed_run(cfg: TrainConfig, run_dir, **trl_overrides: Any) -> dict[str, Any]:
    """`train_testbed_with_trl` with the run's settings (sizes, lr, seed, testbed, completion budget, the replay
    fields that differ from the preset); trl_overrides: further `ReplayGRPOConfig` fields (they win)."""
    from ..integrations.trl import train_testbed_with_trl

    return train_testbed_with_trl(
        run_dir,
        preset=cfg.preset,
        replay_overrides=cfg.replay_overrides(),
        testbed_config=cfg.testbed,
        max_steps=cfg.steps,
        prompts_per_step=cfg.prompts_per_step,
        num_generations=cfg.group_size,
        learning_rate=cfg.lr,
        seed=cfg.seed,
        progress=cfg.progress,
        trl_overrides={"max_completion_length": cfg.completion_budget(), **trl_overrides},
    )


def _train(cfg: TrainConfig, run_dir) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from ..tasks.testbed import TestbedTask, warm_start
    from .evaluation import evaluate
    from .loop import EVAL_SEED_OFFSET, HELDOUT_SEED

    model0, tokenizer, info = warm_start(cfg.testbed, progress=cfg.progress)
    task = TestbedTask(cfg.testbed, tokenizer)
    heldout = task.heldout(cfg.eval_problems, seed=HELDOUT_SEED)
    kw = dict(n_samples=cfg.eval_samples, max_new_tokens=cfg.completion_budget(), temperature=cfg.temperature,
              seed=cfg.seed + EVAL_SEED_OFFSET)
    start = evaluate(model0, tokenizer, task, heldout, **kw)
    # report_to is TRL's own option: TRL's callbacks report under TRL's metric names (train/reward, ...).
    res = train_testbed_run(cfg, run_dir, report_to=cfg.report_to.split(","))
    final = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    end = evaluate(final, tokenizer, task, heldout, **kw)
    summary = {
        "backend": "trl",
        "preset": cfg.preset,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "generated_rollouts": cfg.steps * cfg.prompts_per_step * cfg.group_size,
        "heldout_acc_sampled": {"start": start["acc_sampled"], "end": end["acc_sampled"]},
        "heldout_acc_greedy": {"start": start["acc_greedy"], "end": end["acc_greedy"]},
        "final_eval": {k: v for k, v in end.items() if k != "counts"},
        "replay_rows_total": sum(h.get("replay_rows", 0) for h in res["replay_history"]),
        "setup": {"warm_start": info},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
