"""The built-in trainer: Algorithm 1 of docs/method.md, readable top to bottom.

One step t:
  1. generate G rollouts per fresh prompt with the current policy (behaviour policy pi_t)
  2. score them with the verifiable reward; group-relative advantages
  3. drop groups with zero reward variance
  4-6. evict rollouts older than tau_max, sample replay rows by priority, compose fresh + replay
       (`compose_batch`), one PPO-clip update on the composed batch (`update.py`; update_epochs of them)
  7. insert this step's fresh rows into the buffer with birth step t

The code reads in the same order: `setup` (model, optimizer, buffer, generator), `resume` (checkpoint, logs,
first evaluation), then per step `step` (1-7 above) and `bookkeeping` (metrics row, evaluation, checkpoint),
and `finish` (summary.json, plots).

Where this departs from the paper (or the summary is silent):
  - Behaviour log-probs of fresh rows are read off the update's own (first) forward pass, before the
    optimizer step: the policy has not moved yet, so they equal a separate no-grad pass and cost
    nothing. Replayed rows use the log-probs stored at their birth.
  - Step 7 inserts after the update (as in Algorithm 1), so a step never replays its own fresh rows.
  - When every group of a step has zero variance the step makes no update (nothing to learn from);
    the step counter still advances, so ages and the generation budget stay comparable across arms.
  - A non-finite loss skips the update and is counted; `max_bad_steps` in a row stop the run.
  - loss.beta > 0: the KL reference is a frozen copy of the initial policy; its log-probs are measured once
    per fresh row and stored with it, so a replayed row reuses them (the reference never changes).
  - Learning rate, model and task are the testbed's, not the paper's 0.6B-4B Qwen3 on MATH.
  - Two baselines, off by default: cfg.update_epochs = mu > 1 makes mu whole-batch updates per step (the GRPO
    paper's mu; `update.py`), cfg.dynamic_sampling generates further rounds of fresh prompts until prompts_per_step
    groups survive the filter (DAPO; `dynamic_sampling.py`; with replay.fill_filtered the buffer fills what the
    round cap leaves).
  - An addition, off by default: cfg.drift_probe > 0 measures the policy's drift per step on a fixed probe
    (drift/kl_1, drift/kl_tau; `drift.py`) at the start of each step, without touching the training run.
"""
from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import ReplayBuffer, RolloutBatch, estimate, nonzero_variance_mask
from .. import metric_names as mn
from ..diagnostics import split_tally
from ..session import ReplaySession
from ..step_metrics import step_row
from ..app import tracking
from ..app.console import quiet_third_party
from ..app.run_files import checkpoint_name
from ..generation.transformers import TransformersGenerator
from ..loss import LossConfig
from . import lifecycle, rundir
from .drift import DRIFT_SEED_OFFSET, DriftProbe, lags_for
from . import dynamic_sampling
from .dynamic_sampling import Round, needs_another_round
from .dynamic_sampling import merge as merge_rounds
from .lifecycle import HeldOut, resolve_device
from .logprobs import token_logps
from .lr_schedule import warmup_factor
from ..metric_names import BUFFER_SKIPPED_NONFINITE as NONFINITE_KEY
from .update import epoch_metrics, forward_precision
from .update import update as _update  # the name tests patch
from .memory import card_bytes, check_step_memory, eval_chunk, model_shape
from .rewards import SafeRewardTask, WeightedReward, term_means, training_reward
from .rundir import RunDir
from .train_config import TrainConfig
from .setup import build_policy
from .stopping import CheckpointError, StopSignals, TrainingInterrupted, TrainingStopped  # noqa: F401 (re-exported)


# Named constants (the values are part of every run's results: changing one changes the numbers).
VLLM_PROMPT_ROOM = 4096  # tokens of prompt vLLM reserves room for (max_model_len = this + the completion budget)


@dataclass
class Run:
    """Everything `setup` builds and every step reads (CleanRL keeps these as module-level variables)."""

    cfg: TrainConfig
    run_dir: RunDir  # the run's files: logs, checkpoints, summary
    model: Any
    tokenizer: Any
    ref_model: Any  # frozen copy of the initial policy when loss.beta > 0, else None
    task: Any
    held_out: HeldOut  # the held-out problems, the reward-guarded task and the evaluation settings
    generator: Any
    scorer: WeightedReward  # the training reward (reward_funcs); score_one: the task's own, for evaluation
    optimizer: torch.optim.Optimizer
    scheduler: Any
    session: ReplaySession  # the buffer and its bookkeeping (Algorithm 1 steps 4-7)
    prompt_rng: np.random.Generator
    loss_cfg: LossConfig
    max_new: int  # completion budget in tokens
    setup_info: dict
    drift: DriftProbe | None = None  # the policy-drift probe when cfg.drift_probe > 0
    tracker: tracking.Tracker | None = None
    state: dict = dataclass_field(default_factory=dict)  # counters, evals: what a checkpoint stores
    start: int = 0  # first step to run (the checkpoint's step when resuming)

    @property
    def buffer(self) -> ReplayBuffer:
        return self.session.buffer


class StepOutput(NamedTuple):
    """What one step measured, for the metrics row."""

    gen: Round  # steps 1-3: every generated row's reward, filter mask and completion mask; the kept fresh rows
    update: RolloutBatch  # the composed batch (fresh + replay) the update trained on
    stats: dict[str, Any] | None  # `_update`'s result; None when the step made no update
    drift: dict[str, Any]  # drift/kl_* of the policy that made this step's update ({} when the diagnostic is off)


@quiet_third_party  # one progress bar (ours); third-party bars off, each warning once, printed above the bar
def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run (or resume) the training described by cfg; returns the summary also written to summary.json."""
    with rundir.claim(cfg) as run_dir:  # checked, locked for the run's life, config.yaml written
        return _train(cfg, run_dir)


def _train(cfg: TrainConfig, run_dir: RunDir) -> dict[str, Any]:
    run = setup(cfg, run_dir)
    try:
        resume(run)
        bar = tqdm(range(run.start, cfg.steps), initial=run.start, total=cfg.steps, disable=not cfg.progress,
                   desc="grpo-replay", dynamic_ncols=True)
        run.model.train()
        with StopSignals() as signals:
            for t in bar:
                t0 = time.perf_counter()
                out = step(run, t)
                bookkeeping(run, t, out, t0, bar, signals.received)
        bar.close()
        run.tracker.close()
        return finish(run)
    finally:
        close = getattr(run.generator, "close", None)  # a vLLM engine holds GPU memory and process groups
        if callable(close):
            close()


def setup(cfg: TrainConfig, run_dir: RunDir) -> Run:
    """Model, task, optimizer, buffer, generator: everything before the first step (no checkpoint read yet)."""
    torch.manual_seed(cfg.seed)
    if cfg.torch_threads or cfg.reward == "testbed":
        torch.set_num_threads(cfg.torch_threads or 1)
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # float32 matmuls on TF32
    model, tokenizer, task, setup_info = build_policy(cfg, device)
    check_step_memory(cfg, model, cfg.completion_budget(), device)  # before the first large allocation
    # loss.beta > 0: the KL reference is a frozen copy of the initial policy, taken before a checkpoint
    # loads (build_policy is deterministic, so a resumed run gets the same reference).
    ref_model = _frozen_copy(model) if cfg.loss.beta > 0 else None
    # Seed again after the setup: a warm start trained now (rather than loaded from its cache) consumes the
    # global generators, and the run must not depend on whether the cache existed.
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    max_new = cfg.completion_budget()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_factor(cfg.lr_warmup_steps))
    session = ReplaySession(cfg.replay, seed=cfg.seed)
    prompt_rng = np.random.default_rng(cfg.seed)
    scorer = training_reward(cfg, task)
    # Evaluation through transformers: as many problems at a time as fit beside the step (memory.eval_chunk).
    held_out = HeldOut(cfg, tokenizer, SafeRewardTask(task, scorer),  # evaluation rewards: the same timeout
                       chunk=eval_chunk(cfg, model_shape(model), device.type, card_bytes(device)))
    drift = None
    if cfg.drift_probe:
        # Sampled from the initial policy (build_policy is deterministic; the checkpoint stores it all the same).
        drift = DriftProbe.build(model, tokenizer, [p.prompt for p in held_out.problems], cfg.drift_probe, max_new, cfg.temperature,
                                 seed=cfg.seed + DRIFT_SEED_OFFSET, lags=lags_for(cfg.replay.tau_max),
                                 micro_batch=cfg.micro_batch_size)
        drift.check_memory(model.get_output_embeddings().weight.shape[0])
    if cfg.generator == "vllm":
        from ..generation.vllm import VLLMGenerator

        generator = VLLMGenerator.colocated(model, tokenizer, max_model_len=VLLM_PROMPT_ROOM + max_new, seed=cfg.seed)
        held_out.generator = generator  # the evaluation samples as the rollouts do, its KV cache in vLLM's share
    else:
        generator = TransformersGenerator(model, tokenizer)
    return Run(
        cfg=cfg, run_dir=run_dir, model=model, tokenizer=tokenizer, ref_model=ref_model, task=task, held_out=held_out,
        generator=generator, scorer=scorer, optimizer=optimizer, scheduler=scheduler, session=session,
        prompt_rng=prompt_rng, max_new=max_new, setup_info=setup_info, drift=drift,
        loss_cfg=LossConfig(**{**cfg.loss.__dict__, "max_completion_length": cfg.loss.max_completion_length or max_new}),
    )


def resume(run: Run) -> None:
    """Load the latest checkpoint if any, trim the logs to it, open the trackers, evaluate the start once."""
    run.state = {"generated": 0, "bad_in_a_row": 0, "bad_total": 0, "initial_eval": None}
    ckpt, state = run.run_dir.load_checkpoint(run.model, run.optimizer, run.scheduler, run.buffer, run.prompt_rng,
                                              drift=run.drift)
    if ckpt is not None:
        run.state = state
        run.start = run.state.pop("step")
        run.scorer.restore({k: run.state.pop(k, 0) for k in ("reward_errors", "reward_timeouts")})
        print(f"grpo-replay: resuming {run.run_dir} from {ckpt.name} (step {run.start} of {run.cfg.steps})", flush=True)
        run.generator.sync()  # an external engine (vLLM) was built from the base weights, not the restored ones
    run.run_dir.keep_logs_to(run.start if ckpt is not None else -1)  # the rows after it are redone
    # Every row appended to metrics.jsonl / evals.jsonl also goes to the report_to trackers (none: a no-op).
    first_step = run.start + 1 if ckpt is not None else 0
    run.tracker = tracking.Tracker(run.cfg.report_to, run.run_dir.path, run.cfg.to_dict(), first_step=first_step)
    if run.state["initial_eval"] is None:
        run.state["initial_eval"] = _evaluate(run)
        run.run_dir.log_eval({"step": 0, "generated": 0, **run.state["initial_eval"]}, run.tracker)
    run.state["last_eval"] = run.state.get("last_eval") or run.state["initial_eval"]


def step(run: Run, t: int) -> StepOutput:
    """One step of Algorithm 1: generate, score, filter, compose, update, insert."""
    cfg, session = run.cfg, run.session
    # 0. (diagnostic) drift of pi_t, the policy about to generate and update, from pi_{t-1} and pi_{t-tau_max}.
    t0 = time.perf_counter()
    drift = {**run.drift.measure(run.model, t), "time/drift_s": time.perf_counter() - t0} if run.drift is not None else {}
    # 1-3. Generate, score, filter. dynamic_sampling (DAPO): more rounds of fresh prompts until the batch holds
    #      prompts_per_step groups with non-zero variance, or max_generation_rounds rounds ran.
    rounds = [generate_round(run, t)]
    while cfg.dynamic_sampling and needs_another_round(rounds, cfg.prompts_per_step, cfg.max_generation_rounds):
        rounds.append(generate_round(run, t))
    gen = merge_rounds(rounds, cfg.prompts_per_step)
    fresh = gen.fresh
    if run.ref_model is not None and len(fresh):
        # Stored with the row: the reference is frozen, so a replayed row's ref log-probs stay valid.
        fresh.ref_logps = _no_grad_logps(run.ref_model, fresh, cfg)  # (n_fresh, C)

    # 4-6. Evict stale rows, sample replay rows, compose, update_epochs PPO-clip updates (one by default).
    # n_filtered: the rows the update lacks against one unfiltered round (compose_batch's replay count with
    # replay.fill_filtered): the filtered rows, or with dynamic_sampling what the round cap left unfilled.
    update, fresh_index, _ = session.compose(fresh, t, n_filtered=dynamic_sampling.unfilled_rows(gen))
    fresh_measured = len(fresh_index) == len(fresh)  # every fresh row is in the update: its forward measures them
    if not fresh_measured:
        # Pool composition displaced some fresh rows; they still enter the buffer, so measure their
        # behaviour log-probs now, before the update moves the policy.
        fresh.behaviour_logps = _no_grad_logps(run.model, fresh, cfg)  # (n_fresh, C)
    stats = _update(run.model, run.optimizer, run.scheduler, update, run.loss_cfg, cfg) if len(update) else None
    if stats is not None and not stats["finite"]:
        run.state["bad_in_a_row"] += 1
        run.state["bad_total"] += 1
    elif stats is not None:  # a step without an update (all groups zero-variance) neither counts nor resets
        run.state["bad_in_a_row"] = 0
    run.generator.sync()  # an external engine (vLLM) must sample from the updated policy next step
    if stats is not None and bool(stats.get("drift_dropped", torch.zeros(0)).any()):  # replay.max_drift: evicted
        session.evict_drifted(update.buffer_seq[stats["drift_dropped"]])  # before the insert: their slots are free

    # 7. Insert this step's fresh rows, with the behaviour log-probs the update measured, birth step t.
    if len(fresh) and stats is not None and stats["finite"]:
        if fresh_measured:
            # (n_fresh, C_update) -> (n_fresh, C_fresh): replay rows may have widened the update batch
            fresh.behaviour_logps = stats["fresh_logps"][:, : fresh.completion_ids.shape[1]]
        session.defer(fresh)
        session.flush()  # the update window is the step: its rows enter now, born at t
        stats[NONFINITE_KEY] = session.take_skipped_nonfinite()  # rows that cannot be replayed stay out
    return StepOutput(gen, update, stats, drift)


def generate_round(run: Run, t: int) -> Round:
    """Steps 1-3 for `prompts_per_step` fresh prompts: generate G rollouts each with the current (behaviour)
    policy, score them, compute group-relative advantages, drop the zero-variance groups."""
    cfg = run.cfg
    t0 = time.perf_counter()
    # 1. Generate G rollouts per fresh prompt with the current (behaviour) policy.
    problems = run.task.sample_problems(run.prompt_rng, cfg.prompts_per_step)
    gen = run.generator.sample([p.prompt for p in problems], cfg.group_size, run.max_new, cfg.temperature)
    n_gen = len(gen.texts)
    run.state["generated"] += n_gen  # every generated rollout counts: the budget axis
    t_generate = time.perf_counter() - t0

    # 2. Verifiable reward and group-relative advantages.
    rewards_list, reward_counts = run.scorer(gen.texts, [p for p in problems for _ in range(cfg.group_size)])
    rewards = torch.tensor(rewards_list, dtype=torch.float32)  # (N,)
    group_ids = torch.arange(n_gen) // cfg.group_size  # (N,)
    advantages, group_std = estimate(cfg.estimator, rewards, group_ids)  # (N,), (N,): the round's estimator

    # 3. Drop zero-variance groups (all correct or all wrong: every A_i = 0).
    keep = nonzero_variance_mask(rewards, group_ids)  # (N,) bool
    fresh = RolloutBatch.fresh(
        prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask,
        completion_ids=gen.completion_ids, completion_mask=gen.completion_mask,
        advantages=advantages, rewards=rewards, group_ids=group_ids, group_std=group_std, step=t,
    ).select(keep.nonzero().squeeze(1))  # behaviour log-probs: zeros, filled from the update's forward pass
    return Round(fresh, rewards, keep, gen.completion_mask, reward_counts, t_generate, n_gen)


def bookkeeping(run: Run, t: int, out: StepOutput, t0: float, bar, interrupted: str | None = None) -> None:
    """After step t: the metrics row, evaluation when due, a checkpoint when due (or when a stop signal came);
    stops a run gone non-finite or `interrupted` by a signal."""
    cfg, state = run.cfg, run.state
    row = _metrics_row(run, t, out, t0)
    step_done = t + 1
    if (cfg.eval_every and step_done % cfg.eval_every == 0) or step_done == cfg.steps:
        state["last_eval"] = _evaluate(run)
        run.run_dir.log_eval({"step": step_done, "generated": state["generated"], **state["last_eval"]}, run.tracker)
    run.run_dir.log_metrics(row, run.tracker)
    bar.set_postfix(reward=f"{row['reward']:.3f}", acc=f"{state['last_eval']['acc_sampled']:.3f}", buf=len(run.buffer),
                    replay=f"{row[mn.REPLAY_SHARE]:.2f}")
    stop = state["bad_in_a_row"] >= cfg.max_bad_steps
    if stop or interrupted or (cfg.checkpoint_every and step_done % cfg.checkpoint_every == 0) or step_done == cfg.steps:
        run.run_dir.save_checkpoint(step_done, {**state, **run.scorer.counts()}, cfg.keep_checkpoints,
                                    model=run.model, tokenizer=run.tokenizer,
                                    optimizer=run.optimizer, scheduler=run.scheduler, buffer=run.buffer,
                                    prompt_rng=run.prompt_rng, drift=run.drift, config_yaml=cfg.to_yaml())
    if interrupted and not stop:
        run.tracker.close()
        raise TrainingInterrupted(
            f"{interrupted} after step {step_done}; checkpoint {checkpoint_name(step_done)} written to {run.run_dir}. "
            "Rerun the same command to resume."
        )
    if stop:
        run.tracker.close()
        raise TrainingStopped(
            f"{cfg.max_bad_steps} consecutive steps had a non-finite loss (last at step {step_done}); "
            f"checkpoint written to {run.run_dir}. Lower TrainConfig.lr or check the reward/model."
        )


def _metrics_row(run: Run, t: int, out: StepOutput, t0: float) -> dict[str, Any]:
    """The metrics.jsonl row of step t (also sent to the report_to trackers)."""
    stats, gen = out.stats, out.gen
    replay = _replay_metrics(run, t, out)
    return {
        "step": t + 1,
        "generated": run.state["generated"],
        "reward": float(gen.rewards.mean()),
        mn.ZERO_VARIANCE_SHARE: replay.pop(mn.ZERO_VARIANCE_SHARE),
        "completion_len": float(gen.completion_mask.sum(1).float().mean()),
        "update_rows": replay[mn.FRESH_COUNT] + replay[mn.REPLAY_COUNT],  # rows that reached the loss (max_drift)
        "loss": stats["loss"] if stats else None,
        **({"kl": _masked_mean(stats["token_stats"], "kl")} if stats and run.ref_model is not None else {}),
        "grad_norm": stats["grad_norm"] if stats else None,
        "skipped_nonfinite": bool(stats is not None and not stats["finite"]),
        "lr": stats["lr"] if stats else run.scheduler.get_last_lr()[0],  # the rate this step's update used
        **term_means(gen.reward_counts, len(gen.rewards)),  # reward/errors, /timeouts, rewards/<name>/mean
        **replay,  # the update batch's split, this step's inserted rows, the buffer after the step
        **epoch_metrics(stats, run.cfg.update_epochs),  # epochs/clip_frac_k, epochs/approx_kl_k when update_epochs > 1
        **(dynamic_sampling.metrics(gen) if run.cfg.dynamic_sampling else {}),
        **out.drift,  # drift/kl_1, drift/kl_tau (and time/drift_s) when cfg.drift_probe > 0
        "time/generate_s": gen.t_generate,
        "time/step_s": time.perf_counter() - t0,
    }


def _replay_metrics(run: Run, t: int, out: StepOutput) -> dict[str, Any]:
    """The replay entries of step t's row (`step_row`): the session's tally of the update batch (counts, |A|,
    rewards, ages and clip statistics by kind, the zero-variance share of the generated groups, the drift bound's
    rows under replay.max_drift), the rows inserted and the buffer after the step."""
    stats, gen = out.stats, out.gen
    groups = gen.keep.view(-1, run.cfg.group_size).any(1)
    drift = {}
    if run.cfg.replay.max_drift is not None:  # a step without an update dropped nothing
        dropped = stats["drift_dropped"] if stats else torch.zeros(len(out.update), dtype=torch.bool)
        drift = {"drift": stats["drift"] if stats else None, "dropped": dropped}
    tally = split_tally(out.update, t, stats["token_stats"] if stats else None, groups=len(groups),
                        zero_variance_groups=int((~groups).sum()), **drift)
    return step_row(tally, inserted=run.session.take_inserted(), buffer=run.session.buffer_metrics(t + 1),
                    skipped_nonfinite=stats.get(NONFINITE_KEY, 0) if stats else 0)


def finish(run: Run) -> dict[str, Any]:
    """summary.json and the run's plots; returns the summary."""
    cfg, state = run.cfg, run.state
    summary = run.run_dir.write_summary(lifecycle.summary(
        cfg, generated=state["generated"], start=state["initial_eval"], end=state["last_eval"], setup=run.setup_info,
        skipped_nonfinite_steps=state["bad_total"], reward_errors=run.scorer.errors,
        reward_timeouts=run.scorer.timeouts))
    from ..plotting.training import plot_run

    try:
        plot_run(run.run_dir.path)
    except OSError as e:  # e.g. a full disk: the run itself is complete, a rerun only redraws the plots
        raise TrainingStopped(f"writing the plots into {run.run_dir} failed: {e.strerror or e}; the run is complete "
                              f"(summary.json). Free disk space, then rerun the same command to write them.") from e
    return summary


def _evaluate(run: Run) -> dict[str, Any]:
    return run.held_out(run.model)


@torch.no_grad()
def _no_grad_logps(model, batch: RolloutBatch, cfg: TrainConfig) -> torch.Tensor:
    """(B, C) token log-probs on CPU, computed micro_batch_size rows at a time (like the update)."""
    B = len(batch)
    mb = cfg.micro_batch_size or B
    parts = []
    for i in range(0, B, mb):
        p = batch.select(torch.arange(i, min(i + mb, B)))
        with forward_precision(model, cfg):
            parts.append(token_logps(model, p.prompt_ids, p.prompt_mask, p.completion_ids, p.completion_mask,
                                     cfg.temperature).float().cpu())
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
