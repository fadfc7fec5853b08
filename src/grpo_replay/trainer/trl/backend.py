"""`grpo-replay train --backend trl`: a run through TRL's GRPOTrainer with replay (`ReplayGRPOTrainer`), on the
embedded testbed or on a real model with `--reward math`, claimed, evaluated and summarised like a built-in run
(`rundir.claim`, `lifecycle`). What each TrainConfig key does here: `settings.KEYS`.

The testbed path trains the cached warm start on freshly sampled addition problems (`train_testbed_with_trl`, also
what scripts/smoke_check.py drives). The real-model path takes the built-in trainer's model loading (GGUF
included), `MathTask` prompts and held-out evaluation; TRL receives each problem as a one-message conversation and
applies the tokenizer's chat template itself, which yields exactly the built-in trainer's prompt text. A TRL
checkpoint (model, optimizer, replay buffer) is written every `checkpoint_every` steps, an existing one in the run
directory is resumed, and the trained model is saved to `<run dir>/final`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from ... import metric_names as mn
from ...app.run_files import CONFIG, FINAL, LOG_HISTORY, TRL_CHECKPOINT_PREFIX, TRL_SUMMARY, trl_checkpoint_name
from . import settings
from ..lifecycle import HeldOut, resolve_device, summary
from ..rewards import RewardScorer, SafeRewardTask, WeightedReward, training_reward
from ..rundir import RunDir, claim
from ..train_config import TrainConfig
from .reward_funcs import named_reward_funcs


# The testbed problems TRL's dataset holds; its sampler draws each step's prompts from them.
TRAIN_PROBLEMS = 4096


def no_activation_checkpointing() -> dict[str, bool]:
    """The TrainingArguments setting that turns activation checkpointing off (TRL's GRPOConfig turns it on): transformers
    5.x renamed `gradient_checkpointing` to `activation_checkpointing` and warns on the old name."""
    from transformers import TrainingArguments

    name = "activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__ else "gradient_checkpointing"
    return {name: False}


def train_with_trl(cfg: TrainConfig) -> dict[str, Any]:
    settings.check(cfg)  # before the run directory is claimed or anything is loaded
    with claim(cfg) as run_dir:  # checked, locked for the run's life, config.yaml written
        done = _finished(run_dir, cfg)
        if done is not None:  # nothing to train: never a fresh run over it (it may have no checkpoint to resume)
            return done
        if cfg.reward == "testbed":
            return _train_testbed(cfg, run_dir)
        return _train_real(cfg, run_dir)


def _finished(run_dir, cfg: TrainConfig) -> Optional[dict[str, Any]]:
    """The summary of a run that has done its `cfg.steps` steps (claim refused fewer), else None."""
    import sys

    summary_ = RunDir(run_dir).read_summary()
    if summary_ is None or summary_.get("steps") != cfg.steps:
        return None
    print(f"grpo-replay: {run_dir} has already done its {cfg.steps} steps; nothing to train. To continue it, raise "
          f"steps (--steps N); to re-run its config from scratch: grpo-replay train --config "
          f"{Path(run_dir) / CONFIG} --out NEWDIR", file=sys.stderr, flush=True)
    return summary_


def last_checkpoint(run_dir) -> Optional[str]:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(run_dir)) if any(Path(run_dir).glob(TRL_CHECKPOINT_PREFIX + "*")) else None


def start_evals(run_dir, resume: Optional[str], start: dict[str, Any]) -> None:
    """metrics.jsonl and evals.jsonl (the built-in trainer's form, so compare, plot and the report read a TRL run
    like a built-in one): a new run starts them empty but for the start evaluation's row; a resumed one keeps the
    rows up to the checkpoint's step (the later ones are redone), as the built-in trainer does."""
    run = RunDir(run_dir)
    if resume is None:
        run.metrics.write_text("")
        run.evals.write_text("")
    else:
        run.keep_logs_to(int(resume.rsplit("-", 1)[-1]))
        run.metrics.touch()
    if not run.read_evals():
        run.log_eval({"step": 0, "generated": 0, **start})


def _finish(cfg: TrainConfig, run_dir, held_out: HeldOut, model, start: dict, resume, setup: dict,
            **extra: Any) -> dict[str, Any]:
    """The end of a TRL run that was not stopped, as the built-in trainer ends: the final evaluation row and
    summary.json. Its totals come from metrics.jsonl, which holds every step of the run, those before a resume
    included (the trainer's own history holds only this process's steps)."""
    end = held_out(model)
    settings.append_eval(run_dir, cfg.steps, cfg, end)
    run = RunDir(run_dir)
    replay_rows = sum(int(r.get(mn.REPLAY_COUNT, 0)) for r in run.read_metrics())
    return run.write_summary(summary(
        cfg, backend="trl", generated=cfg.steps * cfg.prompts_per_step * cfg.group_size, start=start, end=end,
        setup=setup, replay_rows_total=replay_rows, **extra, resumed_from=resume))


def _train_testbed(cfg: TrainConfig, run_dir) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from ...tasks.testbed import TestbedTask, warm_start

    torch.set_num_threads(cfg.torch_threads or 1)  # as the built-in trainer on the testbed
    model0, tokenizer, info = warm_start(cfg.testbed, progress=cfg.progress)
    held_out = HeldOut(cfg, tokenizer, TestbedTask(cfg.testbed, tokenizer))
    start = held_out(model0)
    resume = last_checkpoint(run_dir)
    start_evals(run_dir, resume, start)
    res = train_testbed_with_trl(cfg, callbacks=settings.callbacks(cfg, held_out), resume_from_checkpoint=resume)
    settings.raise_if_stopped(cfg, res["trainer"])
    final = AutoModelForCausalLM.from_pretrained(Path(run_dir) / FINAL)
    return _finish(cfg, run_dir, held_out, final, start, resume, {"warm_start": info})


def train_testbed_with_trl(cfg: TrainConfig, callbacks: Optional[list] = None,
                           resume_from_checkpoint: Optional[str] = None, **trl_overrides: Any) -> dict[str, Any]:
    """Train `cfg.testbed`'s warm start (loaded from the cache, or trained first) with `ReplayGRPOTrainer` for
    `cfg.steps` optimizer steps in `cfg.run_dir`, every setting of `cfg` reaching TRL as `settings.trl_kwargs`
    maps it (`settings.check` refuses what cannot; `train_with_trl` checks first). The training prompts are
    `TRAIN_PROBLEMS` problems drawn with `cfg.seed`, each reward call scored within `cfg.reward_timeout`.

    callbacks: TrainerCallbacks; resume_from_checkpoint: a TRL checkpoint to resume; trl_overrides: further
    `ReplayGRPOConfig` fields (they win). Writes `<run dir>/trl_summary.json` and returns {"log_history",
    "replay_history", "final_metrics", "output_dir", "trainer"}; the trained model is saved to `<run dir>/final`.
    """
    from ...integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer
    from ...tasks.testbed import TestbedTask, warm_start

    model, tokenizer, _info = warm_start(cfg.testbed, progress=cfg.progress)
    model.train()
    task = TestbedTask(cfg.testbed, tokenizer)
    problems = task.sample_problems(np.random.default_rng(cfg.seed), TRAIN_PROBLEMS)
    dataset, testbed_reward = _dataset_and_reward(task, problems, cfg.reward_timeout)
    if cfg.reward_funcs:  # the weighted reward: one TRL reward function per name
        testbed_reward = named_reward_funcs(training_reward(cfg, task), _testbed_adapter)
    args = ReplayGRPOConfig(**{**settings.trl_kwargs(cfg), **no_activation_checkpointing(), **trl_overrides})
    out = Path(args.output_dir)  # cfg.run_dir, unless trl_overrides moved it
    trainer = ReplayGRPOTrainer(
        model=model, reward_funcs=testbed_reward, args=args, train_dataset=dataset, processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    trainer.save_model(str(out / FINAL))
    result = {
        "output_dir": str(out),
        "trainer": trainer,
        "log_history": trainer.state.log_history,
        "replay_history": [h.public() for h in trainer.replay_history],  # `ReplayRecord`s, without token ids
        "final_metrics": trainer.state.log_history[-1] if trainer.state.log_history else {},
    }
    out.mkdir(parents=True, exist_ok=True)
    kept = {k: v for k, v in result.items() if k != "trainer"}
    (out / TRL_SUMMARY).write_text(json.dumps(kept, indent=1, default=str))
    return result


def _dataset_and_reward(task, problems: list, timeout: Optional[float] = None) -> tuple[Any, Callable[..., list[float]]]:
    """The problems as a TRL dataset (each problem's fields as columns) and the reward function that reads them
    back (TRL passes every dataset column to the reward function by name)."""
    from datasets import Dataset

    dataset = Dataset.from_dict(
        {
            "prompt": [p.prompt for p in problems],
            "problem_id": [p.id for p in problems],
            "answer": [p.answer for p in problems],
            "difficulty": [p.difficulty for p in problems],
        }
    )

    scorer = RewardScorer(task.reward, timeout) if timeout is not None else None

    def testbed_reward(completions, prompts, problem_id, answer, difficulty, **_: Any) -> list[float]:
        rows = _testbed_rows(prompts, problem_id, answer, difficulty)
        if scorer is not None:
            return scorer(list(completions), rows)[0]
        return [task.reward(c, row) for c, row in zip(completions, rows)]

    return dataset, testbed_reward


def _testbed_rows(prompts, problem_id, answer, difficulty) -> list:
    from ...tasks.testbed import TestbedProblem

    return [TestbedProblem(id=i, prompt=p, answer=a, difficulty=d)
            for p, i, a, d in zip(prompts, problem_id, answer, difficulty)]


def _testbed_adapter(score) -> Callable[..., list[float]]:
    def reward(completions, prompts, problem_id, answer, difficulty, **_: Any) -> list[float]:
        return score(list(completions), _testbed_rows(prompts, problem_id, answer, difficulty))[0]

    return reward


def _train_real(cfg: TrainConfig, run_dir) -> dict[str, Any]:
    import torch
    from datasets import Dataset

    from ...integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer
    from ..memory import card_bytes, check_step_memory, eval_chunk, model_shape
    from ..setup import build_policy

    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    model, tokenizer, task, setup_info = build_policy(cfg, device)
    check_step_memory(cfg, model, cfg.completion_budget(), device)  # before TRL allocates anything
    scorer = training_reward(cfg, task)  # the task's reward (evaluation, and training unless reward_funcs is set)
    # TRL's backend evaluates through transformers whatever generates its rollouts: problems per call sized to fit.
    held_out = HeldOut(cfg, tokenizer, SafeRewardTask(task, scorer),  # evaluation rewards guarded alike
                       chunk=eval_chunk(cfg, model_shape(model), device.type, card_bytes(device)))
    start = held_out(model)

    by_id = {p.id: p for p in task.train}
    prompts = [[{"role": "user", "content": p.message}] if task.use_chat_template else p.prompt for p in task.train]
    dataset = Dataset.from_dict({"prompt": prompts, "problem_id": [p.id for p in task.train]})

    def math_adapter(score) -> Callable[..., list[float]]:
        def math_reward(completions, problem_id, **_: Any) -> list[float]:
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return score(texts, [by_id[i] for i in problem_id])[0]

        return math_reward

    # the weighted reward: one TRL reward function per name, counted with the evaluation's in `scorer`
    math_reward = named_reward_funcs(scorer, math_adapter) if cfg.reward_funcs else math_adapter(scorer)

    args = ReplayGRPOConfig(**{**settings.trl_kwargs(cfg), "output_dir": str(run_dir),
                                 "use_cpu": device.type == "cpu",
                                 **no_activation_checkpointing()})
    model.train()
    trainer = ReplayGRPOTrainer(model=model, reward_funcs=math_reward, args=args, train_dataset=dataset,
                                processing_class=tokenizer, callbacks=settings.callbacks(cfg, held_out))
    resume = last_checkpoint(run_dir)
    start_evals(run_dir, resume, start)
    counts = reward_counts_callback(scorer, trainer.accelerator.process_index)
    trainer.add_callback(counts)
    counts.restore(resume)
    trainer.train(resume_from_checkpoint=resume)
    settings.raise_if_stopped(cfg, trainer)
    trainer.save_model(str(Path(run_dir) / FINAL))
    (Path(run_dir) / LOG_HISTORY).write_text(json.dumps(trainer.state.log_history, indent=1, default=str))
    return _finish(cfg, run_dir, held_out, trainer.model, start, resume, setup_info,
                   reward_errors=scorer.errors, reward_timeouts=scorer.timeouts)


def reward_counts_callback(scorer: RewardScorer | WeightedReward, rank: int):
    """A TRL callback that keeps the reward scorer's error and timeout totals (this process's) in every checkpoint
    and puts them back on resume, so a resumed run's summary.json counts the steps before the resume too."""
    from transformers import TrainerCallback

    name = f"grpo_replay_reward_counts_rank{rank}.json"

    class _RewardCounts(TrainerCallback):
        def on_save(self, args, state, control, **_: Any):  # after TRL wrote checkpoint-<step>
            path = Path(args.output_dir) / trl_checkpoint_name(state.global_step)
            if path.is_dir():
                (path / name).write_text(json.dumps(scorer.counts()))

        def restore(self, checkpoint: Optional[str]) -> None:
            saved = Path(checkpoint) / name if checkpoint else None
            if saved is not None and saved.is_file():
                scorer.restore(json.loads(saved.read_text()))

    return _RewardCounts()

