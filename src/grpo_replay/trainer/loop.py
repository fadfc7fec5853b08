"""The built-in trainer: Algorithm 1 of METHOD.md, readable top to bottom.

One step t:
  1. generate G rollouts per fresh prompt with the current policy (behaviour policy pi_t)
  2. score them with the verifiable reward; group-relative advantages
  3. drop groups with zero reward variance
  4-6. evict rollouts older than tau_max, sample replay rows by priority, compose fresh + replay
       (`compose_batch`), one PPO-clip update on the composed batch
  7. insert this step's fresh rows into the buffer with birth step t

Where this departs from the paper (or the summary is silent):
  - Behaviour log-probs of fresh rows are read off the update's own forward pass, before the optimizer
    step: with one update per batch the policy has not moved yet, so they equal a separate no-grad
    pass and cost nothing. Replayed rows use the log-probs stored at their birth.
  - Step 7 inserts after the update (as in Algorithm 1), so a step never replays its own fresh rows.
  - When every group of a step has zero variance the step makes no update (nothing to learn from);
    the step counter still advances, so ages and the generation budget stay comparable across arms.
  - A non-finite loss skips the update and is counted; `max_bad_steps` in a row stop the run.
  - loss.beta > 0: the KL reference is a frozen copy of the initial policy; its log-probs are measured once
    per fresh row and stored with it, so a replayed row reuses them (the reference never changes).
  - Learning rate, model and task are the testbed's, not the paper's 0.6B-4B Qwen3 on MATH.
"""
from __future__ import annotations

import copy
import errno
import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import tracking
from ..console import quiet_third_party
from .. import ReplayBuffer, RolloutBatch, compose_batch, group_advantages, nonzero_variance_mask, ppo_clip_loss, split_metrics
from ..loss import LossConfig
from . import checkpoint, rundir
from .config import TrainConfig
from .evaluation import evaluate
from .generation import TransformersGenerator, VLLMGenerator, token_logps
from .rewards import RewardScorer
from .setup import build_policy


class TrainingStopped(RuntimeError):
    """Raised after max_bad_steps consecutive non-finite losses (a checkpoint was written first)."""


class CheckpointError(RuntimeError):
    """Writing a checkpoint failed (e.g. disk full); the previous checkpoint is intact and the run stops."""


@quiet_third_party  # one progress bar (ours); third-party bars off, each warning once, printed above the bar
def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run (or resume) the training described by cfg; returns the summary also written to summary.json."""
    with rundir.claim(cfg) as run_dir:  # checked, locked for the run's life, config.yaml written
        return _train(cfg, run_dir)


def _train(cfg: TrainConfig, run_dir: Path) -> dict[str, Any]:
    torch.manual_seed(cfg.seed)
    if cfg.torch_threads or cfg.reward == "testbed":
        torch.set_num_threads(cfg.torch_threads or 1)
    device = _device(cfg.device)

    model, tokenizer, task, setup_info = build_policy(cfg, device)
    # loss.beta > 0: the KL reference is a frozen copy of the initial policy, taken before a checkpoint
    # loads (build_policy is deterministic, so a resumed run gets the same reference).
    ref_model = _frozen_copy(model) if cfg.loss.beta > 0 else None
    # Seed again after the setup: a warm start trained now (rather than loaded from its cache) consumes the
    # global generators, and the run must not depend on whether the cache existed.
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    max_new = cfg.completion_budget()
    loss_cfg = LossConfig(**{**cfg.loss.__dict__, "max_completion_length": cfg.loss.max_completion_length or max_new})
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, cfg.lr_warmup_steps)))
    buffer = ReplayBuffer(cfg.replay, seed=cfg.seed)
    prompt_rng = np.random.default_rng(cfg.seed)
    scorer = RewardScorer(task.reward, cfg.reward_timeout)
    eval_task = _SafeRewardTask(task, scorer)  # evaluation rewards are guarded by the same timeout
    heldout = task.heldout(cfg.eval_problems, seed=12345)
    if cfg.generator == "vllm":
        generator = VLLMGenerator(model, tokenizer, max_model_len=4096 + max_new, seed=cfg.seed)
    else:
        generator = TransformersGenerator(model, tokenizer)
    eval_kw = dict(n_samples=cfg.eval_samples, max_new_tokens=max_new, temperature=cfg.temperature, seed=cfg.seed + 777)

    # --- resume -----------------------------------------------------------------------------------------
    state = {"generated": 0, "bad_in_a_row": 0, "bad_total": 0, "initial_eval": None}
    start = 0
    ckpt = checkpoint.latest(run_dir)
    if ckpt is not None:
        state = checkpoint.load(ckpt, model, optimizer, scheduler, buffer, prompt_rng)
        start = state.pop("step")
        print(f"grpo-replay: resuming {run_dir} from {ckpt.name} (step {start} of {cfg.steps})", flush=True)
        generator.sync()  # an external engine (vLLM) was built from the base weights, not the restored ones
    # Rows after the checkpoint (or every row, without one) are redone: drop them so the logs match an
    # uninterrupted run. An eval at the checkpoint's own step was written before the checkpoint: kept.
    _truncate_jsonl(run_dir / "metrics.jsonl", start if ckpt is not None else -1)
    _truncate_jsonl(run_dir / "evals.jsonl", start if ckpt is not None else -1)
    # Every row appended to metrics.jsonl / evals.jsonl also goes to the report_to trackers (none: a no-op).
    tracker = tracking.Tracker(cfg.report_to, run_dir, cfg.to_dict(), first_step=start + 1 if ckpt is not None else 0)
    if state["initial_eval"] is None:
        state["initial_eval"] = evaluate(model, tokenizer, eval_task, heldout, **eval_kw)
        _append(run_dir / "evals.jsonl", {"step": 0, "generated": 0, **state["initial_eval"]}, tracker)

    def save_checkpoint(step_done: int) -> None:
        state["last_eval"] = last_eval
        try:
            checkpoint.save(
                run_dir, step_done, model, tokenizer, optimizer, scheduler, buffer, prompt_rng, state, keep=cfg.keep_checkpoints
            )
        except OSError as e:
            prev = checkpoint.latest(run_dir)
            intact = f"previous checkpoint {prev.name} is intact" if prev else "there is no previous checkpoint"
            reason = e.strerror or str(e)
            todo = "Free disk space, then rerun" if e.errno == errno.ENOSPC else "Rerun"
            raise CheckpointError(
                f"checkpoint at step {step_done} failed: {reason}; {intact} in {run_dir}. "
                f"{todo} the same command to resume from the last checkpoint."
            ) from e

    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not cfg.progress, desc="grpo-replay", dynamic_ncols=True)
    last_eval = state.get("last_eval") or state["initial_eval"]
    model.train()
    for t in bar:
        t0 = time.perf_counter()
        # 1. Generate G rollouts per fresh prompt with the current (behaviour) policy.
        problems = task.sample_problems(prompt_rng, cfg.prompts_per_step)
        gen = generator([p.prompt for p in problems], cfg.group_size, max_new, cfg.temperature)
        rows_problems = [p for p in problems for _ in range(cfg.group_size)]
        n_gen = len(gen.texts)
        state["generated"] += n_gen
        t_gen = time.perf_counter() - t0

        # 2. Verifiable reward and group-relative advantages.
        rewards_list, reward_counts = scorer(gen.texts, rows_problems)
        rewards = torch.tensor(rewards_list, dtype=torch.float32)  # (N,)
        group_ids = torch.arange(n_gen) // cfg.group_size  # (N,)
        advantages, group_std = group_advantages(rewards, group_ids, scale=cfg.advantage_scale)  # (N,), (N,)

        # 3. Drop zero-variance groups (all correct or all wrong: every A_i = 0).
        keep = nonzero_variance_mask(rewards, group_ids)  # (N,) bool
        fresh = RolloutBatch(
            prompt_ids=gen.prompt_ids,
            prompt_mask=gen.prompt_mask,
            completion_ids=gen.completion_ids,
            completion_mask=gen.completion_mask,
            behaviour_logps=torch.zeros(gen.completion_ids.shape),  # filled from the update's forward pass
            advantages=advantages,
            rewards=rewards,
            group_ids=group_ids,
            group_std=group_std,
            birth_step=torch.full((n_gen,), t, dtype=torch.long),
            is_replay=torch.zeros(n_gen, dtype=torch.bool),
        ).select(keep.nonzero().squeeze(1))
        if ref_model is not None and len(fresh):
            # Stored with the row: the reference is frozen, so a replayed row's ref log-probs stay valid.
            fresh.ref_logps = _no_grad_logps(ref_model, fresh, cfg)  # (n_fresh, C)

        # 4-6. Evict stale rows, sample replay rows, compose, one PPO-clip update.
        update = compose_batch(fresh, buffer, t) if len(fresh) else fresh
        fresh_measured = int((~update.is_replay).sum()) == len(fresh)
        if not fresh_measured:
            # Pool composition displaced some fresh rows; they still enter the buffer, so measure their
            # behaviour log-probs now, before the update moves the policy.
            fresh.behaviour_logps = _no_grad_logps(model, fresh, cfg)  # (n_fresh, C)
        stats = _update(model, optimizer, scheduler, update, loss_cfg, cfg) if len(update) else None
        if stats is not None and not stats["finite"]:
            state["bad_in_a_row"] += 1
            state["bad_total"] += 1
        elif stats is not None:  # a step without an update (all groups zero-variance) neither counts nor resets
            state["bad_in_a_row"] = 0

        generator.sync()  # an external engine (vLLM) must sample from the updated policy next step

        # 7. Insert this step's fresh rows, with the behaviour log-probs the update measured, birth step t.
        if len(fresh) and stats is not None and stats["finite"]:
            if fresh_measured:
                # (n_fresh, C_update) -> (n_fresh, C_fresh): replay rows may have widened the update batch
                fresh.behaviour_logps = stats["fresh_logps"][:, : fresh.completion_ids.shape[1]]
            buffer.add(fresh, t)

        # --- bookkeeping: metrics, evaluation, checkpoint ---------------------------------------------------
        m: dict[str, Any] = {
            "step": t + 1,
            "generated": state["generated"],
            "reward": float(rewards.mean()),
            "frac_zero_var_groups": 1.0 - float(keep.view(-1, cfg.group_size).any(1).float().mean()),
            "completion_len": float(gen.completion_mask.sum(1).float().mean()),
            "update_rows": len(update),
            "loss": stats["loss"] if stats else None,
            **({"kl": _masked_mean(stats["token_stats"], "kl")} if stats and ref_model is not None else {}),
            "grad_norm": stats["grad_norm"] if stats else None,
            "skipped_nonfinite": bool(stats is not None and not stats["finite"]),
            "lr": scheduler.get_last_lr()[0],
            **reward_counts,
            **split_metrics(update, t, stats["token_stats"] if stats else None),
            **buffer.stats(t + 1),
            "time/generate_s": t_gen,
            "time/step_s": time.perf_counter() - t0,
        }
        step_done = t + 1
        if (cfg.eval_every and step_done % cfg.eval_every == 0) or step_done == cfg.steps:
            last_eval = evaluate(model, tokenizer, eval_task, heldout, **eval_kw)
            _append(run_dir / "evals.jsonl", {"step": step_done, "generated": state["generated"], **last_eval}, tracker)
        _append(run_dir / "metrics.jsonl", m, tracker)
        bar.set_postfix(
            reward=f"{m['reward']:.3f}", acc=f"{last_eval['acc_sampled']:.3f}", buf=len(buffer), replay=f"{m['replay/share']:.2f}"
        )
        if state["bad_in_a_row"] >= cfg.max_bad_steps:
            save_checkpoint(step_done)
            tracker.close()
            raise TrainingStopped(
                f"{cfg.max_bad_steps} consecutive steps had a non-finite loss (last at step {step_done}); "
                f"checkpoint written to {run_dir}. Lower TrainConfig.lr or check the reward/model."
            )
        if (cfg.checkpoint_every and step_done % cfg.checkpoint_every == 0) or step_done == cfg.steps:
            save_checkpoint(step_done)
    bar.close()
    tracker.close()

    summary = _summary(cfg, state, last_eval, setup_info)
    summary["reward_errors"], summary["reward_timeouts"] = scorer.errors, scorer.timeouts
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    from .plots import plot_run

    plot_run(run_dir)
    return summary


def _update(model, optimizer, scheduler, batch: RolloutBatch, loss_cfg: LossConfig, cfg: TrainConfig) -> dict[str, Any]:
    """One optimizer step on the composed batch, accumulated over micro-batches.

    Each micro-batch's loss is weighted by its share of the normaliser (tokens for token_mean, rows
    otherwise), so the accumulated gradient equals the whole-batch loss's gradient."""
    B = len(batch)
    mb = cfg.micro_batch_size or B
    device = next(model.parameters()).device
    total_tokens = batch.completion_mask.sum().clamp(min=1).to(device)
    optimizer.zero_grad(set_to_none=True)
    logps_all, stats_all, loss_sum = [], [], 0.0
    for i in range(0, B, mb):
        part = batch.select(torch.arange(i, min(i + mb, B))).to(device)  # the loss needs every tensor on the model's device
        logps = token_logps(model, part.prompt_ids, part.prompt_mask, part.completion_ids, part.completion_mask, cfg.temperature)  # (b, C)
        # Fresh rows were generated by the current parameters: their behaviour log-probs are these values.
        fresh_rows = ~part.is_replay
        part.behaviour_logps = torch.where(fresh_rows.unsqueeze(1), logps.detach(), part.behaviour_logps)
        loss, st = ppo_clip_loss(logps, part, loss_cfg)
        weight = (part.completion_mask.sum() / total_tokens) if loss_cfg.aggregation == "token_mean" else len(part) / B
        (loss * weight).backward()
        loss_sum += float(loss.detach()) * float(weight)
        logps_all.append(logps.detach().cpu())
        stats_all.append({k: v.cpu() for k, v in st.items()})
    finite = math.isfinite(loss_sum)
    grad_norm = None
    if finite:
        params = [p for p in model.parameters() if p.grad is not None]
        # max_norm=inf measures the norm (to catch NaN/inf gradients) without scaling: clipping disabled.
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf))
        finite = math.isfinite(grad_norm)
    if finite:
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    logps = torch.cat(logps_all)  # (B, C)
    token_stats = {k: torch.cat([s[k] for s in stats_all]) for k in stats_all[0]}
    return {
        "loss": loss_sum if finite else None,
        "grad_norm": grad_norm,
        "finite": finite,
        "fresh_logps": logps[~batch.is_replay],
        "token_stats": token_stats,
    }


@torch.no_grad()
def _no_grad_logps(model, batch: RolloutBatch, cfg: TrainConfig) -> torch.Tensor:
    """(B, C) token log-probs on CPU, computed micro_batch_size rows at a time (like the update)."""
    B = len(batch)
    mb = cfg.micro_batch_size or B
    parts = []
    for i in range(0, B, mb):
        p = batch.select(torch.arange(i, min(i + mb, B)))
        parts.append(token_logps(model, p.prompt_ids, p.prompt_mask, p.completion_ids, p.completion_mask, cfg.temperature).cpu())
    return torch.cat(parts)


def _masked_mean(token_stats: dict[str, torch.Tensor], key: str) -> float:
    m = token_stats["mask"]
    return float(token_stats[key][m].mean()) if m.any() else 0.0


def _frozen_copy(model):
    ref = copy.deepcopy(model)
    ref.eval()  # no dropout: the reference is a fixed distribution
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def _summary(cfg: TrainConfig, state: dict, final_eval: dict, setup_info: dict) -> dict[str, Any]:
    init = state["initial_eval"]
    return {
        "preset": cfg.preset,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "generated_rollouts": state["generated"],
        "skipped_nonfinite_steps": state["bad_total"],
        "heldout_acc_sampled": {"start": init["acc_sampled"], "end": final_eval["acc_sampled"]},
        "heldout_acc_greedy": {"start": init["acc_greedy"], "end": final_eval["acc_greedy"]},
        "final_eval": {k: v for k, v in final_eval.items() if k != "counts"},
        "setup": setup_info,
    }


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("TrainConfig.device='cuda' but no CUDA device is available; allowed here: auto, cpu")
    return torch.device(name)


def _append(path: Path, row: dict, tracker: tracking.Tracker | None = None) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    if tracker is not None:
        tracker.log(row)


def _truncate_jsonl(path: Path, step: int, key: str = "step") -> None:
    """On resume, keep the rows with row[key] <= step (those the checkpoint covers) and drop the rest.

    A line cut short by a kill mid-write is dropped too (it can only belong to a step being redone); the
    file is replaced atomically so a second crash here cannot lose the rows before the checkpoint."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get(key), int) and row[key] <= step:
            keep.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write("".join(keep))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _SafeRewardTask:
    """The task as `evaluate` sees it, with `reward` going through the scorer (timeout, errors scored 0)."""

    def __init__(self, task, scorer: RewardScorer):
        self._task, self._scorer = task, scorer

    def reward(self, text: str, problem) -> float:
        return self._scorer.score_one(text, problem)

    def __getattr__(self, name: str):
        return getattr(self._task, name)
