"""`grpo-replay train --backend trl`: the testbed through `ReplayGRPOTrainer`, evaluated like the built-in run
(a real model with `--reward math`: `trl_real.py`). What each TrainConfig key does here: `trl_settings.KEYS`."""
from __future__ import annotations

import json
from typing import Any, Optional

from . import trl_settings
from .train_config import TrainConfig
from .rundir import claim


def train_with_trl(cfg: TrainConfig) -> dict[str, Any]:
    trl_settings.check(cfg)  # before the run directory is claimed or anything is loaded
    with claim(cfg) as run_dir:  # checked, locked for the run's life, config.yaml written
        if cfg.reward != "testbed":  # a real model and data set (GGUF or transformers checkpoint)
            from .trl_real import train_real_with_trl

            return train_real_with_trl(cfg)
        return _train(cfg, run_dir)


def last_checkpoint(run_dir) -> Optional[str]:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(run_dir)) if any(run_dir.glob("checkpoint-*")) else None


def start_evals(run_dir, resume: Optional[str], start: dict[str, Any]) -> None:
    """evals.jsonl: the start row for a new run; a resumed run keeps its rows up to the checkpoint's step."""
    path = run_dir / "evals.jsonl"
    if resume is None or not path.exists():
        path.write_text(json.dumps({"step": 0, "generated": 0, **start}) + "\n")
        return
    step = int(resume.rsplit("-", 1)[-1])
    rows = [r for r in path.read_text().splitlines() if r.strip() and json.loads(r)["step"] <= step]
    path.write_text("".join(r + "\n" for r in rows))


def train_testbed_run(cfg: TrainConfig, run_dir, callbacks: Optional[list] = None, resume: Optional[str] = None,
                      **trl_overrides: Any) -> dict[str, Any]:
    """`train_testbed_with_trl` with every setting of the run (`trl_settings.trl_kwargs`); trl_overrides: further
    `ReplayGRPOConfig` fields (they win)."""
    from ..integrations.trl import train_testbed_with_trl

    return train_testbed_with_trl(
        run_dir,
        preset=cfg.preset,
        replay_overrides=cfg.replay_overrides(),
        testbed_config=cfg.testbed,
        seed=cfg.seed,
        progress=cfg.progress,
        trl_overrides={**trl_settings.trl_kwargs(cfg), "output_dir": str(run_dir), **trl_overrides},
        reward_timeout=cfg.reward_timeout,
        callbacks=callbacks,
        resume_from_checkpoint=resume,
    )


def _train(cfg: TrainConfig, run_dir) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from ..tasks.testbed import TestbedTask, warm_start
    from .evaluation import evaluate
    from .loop import EVAL_SEED_OFFSET, HELDOUT_SEED

    torch.set_num_threads(cfg.torch_threads or 1)  # as the built-in trainer on the testbed
    model0, tokenizer, info = warm_start(cfg.testbed, progress=cfg.progress)
    task = TestbedTask(cfg.testbed, tokenizer)
    heldout = task.heldout(cfg.eval_problems, seed=HELDOUT_SEED)
    kw = dict(n_samples=cfg.eval_samples, max_new_tokens=cfg.completion_budget(), temperature=cfg.temperature,
              seed=cfg.seed + EVAL_SEED_OFFSET)
    start = evaluate(model0, tokenizer, task, heldout, **kw)
    resume = last_checkpoint(run_dir)
    start_evals(run_dir, resume, start)
    callbacks = trl_settings.callbacks(cfg, lambda m: evaluate(m, tokenizer, task, heldout, **kw))
    res = train_testbed_run(cfg, run_dir, callbacks=callbacks, resume=resume)
    trl_settings.raise_if_stopped(cfg, res["trainer"])
    final = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    end = evaluate(final, tokenizer, task, heldout, **kw)
    trl_settings.append_eval(run_dir, cfg.steps, cfg, end)
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
        "resumed_from": resume,
        "setup": {"warm_start": info},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
