"""What `--backend trl` does with every `TrainConfig` key (testbed and real-model paths alike).

Each key either reaches TRL (`trl_kwargs`: the `ReplayGRPOConfig` fields), is used by this command around TRL
(warm start, held-out evaluation, reward scoring, run directory, the two callbacks below), or is refused by
`check` with a `ConfigError` naming it and the allowed values (exit 2) before anything is trained or written.
`KEYS` is the decision per key; a key of TrainConfig missing from it is a bug (a test enumerates them).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ...errors import ConfigError
from ...generation.vllm import GPU_SHARE as VLLM_GPU_SHARE  # TRL's colocated engine gets the built-in one's share
from ..train_config import FIELDS, TrainConfig
from .reward_funcs import reward_weights

AGGREGATION_TO_LOSS_TYPE = {"token_mean": "dapo", "seq_mean": "grpo", "dr_grpo": "dr_grpo"}

# key (or dotted prefix ending in '.') -> how --backend trl uses it. Also the docs' table.
KEYS: dict[str, str] = {
    "preset": "replay_preset",
    "seed": "seed (TRL's data order and sampling; the buffer's seed)",
    "steps": "max_steps",
    "prompts_per_step": "the generation batch, prompts_per_step x group_size rows (one generation, one optimizer step)",
    "group_size": "num_generations",
    "lr": "learning_rate",
    "lr_warmup_steps": "a callback giving TRL's constant scheduler the built-in trainer's warm-up (lr_schedule.py)",
    "weight_decay": "weight_decay",
    "max_grad_norm": "max_grad_norm (0 disables clipping, as in transformers)",
    "temperature": "temperature (TRL samples and computes log-probs at it; held-out sampling too)",
    "max_new_tokens": "max_completion_length (the completion budget)",
    "micro_batch_size": "per_device_train_batch_size (0: the whole generation batch); gradient_accumulation_steps = "
                        "steps_per_generation = rows / micro_batch_size; refused unless it divides the rows",
    "update_epochs": "refused unless 1: TRL's num_iterations makes each reuse one of max_steps' optimizer steps, and "
                     "TRL's save/warm-up steps and the replay ages count those too, so every step count would change "
                     "meaning (set num_iterations on ReplayGRPOConfig through the Python API)",
    "dynamic_sampling": "refused unless false: TRL's GRPOTrainer generates one batch per step",
    "max_generation_rounds": "used only with dynamic_sampling (refused with backend='trl'); TrainConfig refuses a "
                             "non-default value without it",
    "advantage_scale": "scale_rewards (group | batch | none)",
    "advantage_estimator": "refused unless grpo: TRL's GRPOTrainer computes group-relative advantages (scaled by "
                           "scale_rewards = advantage_scale); rloo and reinforce_plus_plus_baseline are the built-in "
                           "trainer's",
    "reward_funcs": "reward_funcs: one TRL reward function per name (each scored with reward_timeout, logged as "
                    "rewards/<name>/mean)",
    "reward_weights": "reward_weights",
    "eval_every": "held-out evaluation every eval_every steps (a callback), and at the start and end",
    "eval_problems": "held-out evaluation",
    "eval_samples": "held-out evaluation",
    "checkpoint_every": "save_strategy steps, save_steps; the last TRL checkpoint in the run directory is resumed",
    "keep_checkpoints": "save_total_limit",
    "drift_probe": "refused unless 0 (TrainConfig: the drift diagnostic is the built-in trainer's)",
    "max_bad_steps": "a callback: a step with non-finite gradients is skipped; this many in a row stop the run (exit 1)",
    "reward_timeout": "each reward call is scored with this timeout (a timed-out completion scores 0 and is counted)",
    "out_dir": "output_dir (the run directory)",
    "torch_threads": "torch.set_num_threads (0 = 1 for the testbed, torch's default otherwise)",
    "device": "use_cpu (cpu; auto without CUDA) or not (cuda; auto with CUDA)",
    "backend": "selects this path",
    "generator": "use_vllm: vllm is TRL's colocated vLLM (vllm_mode colocate, vllm_gpu_memory_utilization 0.3, the "
                 "built-in trainer's share); transformers is TRL's own generate",
    "precision": "bf16 (TRL's bf16 autocast over float32 master weights): true for bf16, and for auto on a GPU; "
                 "tf32 on a GPU unless fp32",
    "model": "the real-model path: the policy",
    "model_file": "the real-model path: the GGUF file",
    "data": "the real-model path: the training prompts",
    "reward": "testbed or the real-model path's math reward",
    "heldout_data": "the real-model path: the held-out prompts",
    "progress": "disable_tqdm = not progress",
    "report_to": "report_to (TRL's callbacks, under TRL's metric names)",
    "replay.": "replay_* (every replay field that differs from the preset)",
    "loss.eps_low": "epsilon",
    "loss.eps_high": "epsilon_high",
    "loss.dual_clip_c": "delta (TRL's two-sided clip, the same bound when > 1 + eps_high; refused otherwise); None = no delta",
    "loss.aggregation": "loss_type: token_mean -> dapo, seq_mean -> grpo, dr_grpo -> dr_grpo",
    "loss.beta": "beta (TRL loads the reference model from the policy's path)",
    "loss.max_completion_length": "refused unless None or the completion budget (TRL's dr_grpo normaliser is max_completion_length)",
    "testbed_preset": "the testbed's warm start and task",
    "testbed.": "the testbed's warm start and task",
}


def decision(key: str) -> str | None:
    """KEYS' entry for a flat TrainConfig key (exact, or its dotted prefix)."""
    if key in KEYS:
        return KEYS[key]
    prefix = key.split(".")[0] + "."
    return KEYS.get(prefix) if "." in key else None


def check(cfg: TrainConfig) -> None:
    """Refuse, naming the key and what is allowed, every setting `--backend trl` cannot apply."""
    missing = [k for k in FIELDS if decision(k) is None]
    if missing:  # a new TrainConfig key nobody decided about for TRL: never apply it silently
        raise ConfigError(f"TrainConfig.{missing[0]} has no meaning defined for backend='trl'; allowed: builtin")
    rows = cfg.prompts_per_step * cfg.group_size
    if cfg.micro_batch_size and rows % cfg.micro_batch_size:
        _refuse("micro_batch_size", cfg.micro_batch_size, f"0 or a divisor of prompts_per_step x group_size = {rows} "
                "with backend='trl' (TRL's per-device batch; the generation spans rows / micro_batch_size of them)")
    share = trl_share(cfg)
    if not share.realised:
        _refuse("micro_batch_size", cfg.micro_batch_size or rows, "one of "
                + ", ".join(map(str, micro_batches_that_realise(cfg)[:6])) + f" with backend='trl' and "
                f"replay.replay_ratio={cfg.replay.replay_ratio}: the step's {share.kept} fresh rows in "
                f"steps_per_generation = {share.unit} micro-batches would train no replay row ({share.planned} "
                "planned): the replay arm would be GRPO; each forward holds micro_batch_size x (1 + replay_ratio) rows")
    if cfg.update_epochs != 1:
        _refuse("update_epochs", cfg.update_epochs, "1 with backend='trl' (TRL's num_iterations counts each reuse as "
                "one of max_steps' optimizer steps, and the replay ages, save and warm-up steps count them too, so "
                "`steps` would no longer count generations; set num_iterations on ReplayGRPOConfig in Python)")
    check_reward(cfg)
    if cfg.dynamic_sampling:
        _refuse("dynamic_sampling", cfg.dynamic_sampling, "false with backend='trl' (TRL's GRPOTrainer generates one "
                "batch per step; dynamic sampling is the built-in trainer's)")
    c = cfg.loss.dual_clip_c
    if c is not None and not c > 1 + cfg.loss.eps_high:
        _refuse("loss.dual_clip_c", c, f"None or a number > 1 + loss.eps_high = {1 + cfg.loss.eps_high:g} with "
                "backend='trl' (TRL's delta bounds the ratio; it equals the dual clip only above the upper clip)")
    budget = cfg.completion_budget()
    if cfg.loss.max_completion_length not in (None, budget):
        _refuse("loss.max_completion_length", cfg.loss.max_completion_length,
                f"None or {budget} (the completion budget) with backend='trl'")


def check_reward(cfg: TrainConfig) -> None:
    """The estimator `--backend trl` applies: TRL's own GRPO advantages."""
    if cfg.advantage_estimator != "grpo":
        _refuse("advantage_estimator", cfg.advantage_estimator, "grpo with backend='trl' (TRL's GRPOTrainer computes "
                "group-relative advantages; advantage_scale picks its scale_rewards: group, batch or none)")


def trl_share(cfg: TrainConfig):
    """The replay rows a step of this config trains on under TRL's split (`step_plan.plan_step`)."""
    from ...step_plan import plan_step

    rows = cfg.prompts_per_step * cfg.group_size
    return plan_step(rows, cfg.replay, rows // (cfg.micro_batch_size or rows), group_size=cfg.group_size)


def micro_batches_that_realise(cfg: TrainConfig) -> list[int]:
    """The micro_batch_size values (divisors of the step's rows) under which TRL trains replay rows."""
    import dataclasses

    rows = cfg.prompts_per_step * cfg.group_size
    ok = [m for m in range(1, rows + 1) if rows % m == 0
          and trl_share(dataclasses.replace(cfg, micro_batch_size=m)).realised]
    return sorted(ok, key=lambda m: (m < (cfg.micro_batch_size or rows), m))


def _refuse(key: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"TrainConfig.{key}={value!r} is invalid; allowed: {allowed}")


def use_cpu(cfg: TrainConfig) -> bool:
    if cfg.device == "auto":
        import torch

        return not torch.cuda.is_available()
    return cfg.device == "cpu"


def trl_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The `ReplayGRPOConfig` fields of the run (after `check`)."""
    from ...integrations.trl.replay_grpo_config import trl_replay_kwargs

    rows = cfg.prompts_per_step * cfg.group_size
    micro = cfg.micro_batch_size or rows
    vllm = dict(vllm_mode="colocate", vllm_gpu_memory_utilization=VLLM_GPU_SHARE) if cfg.generator == "vllm" else {}
    return dict(
        output_dir=str(cfg.run_dir),
        use_cpu=use_cpu(cfg),
        # TRL's mixed precision: bf16 autocast over float32 master weights, with TF32 matmuls (a GPU only)
        bf16=cfg.precision == "bf16" or (cfg.precision == "auto" and not use_cpu(cfg)),
        tf32=True if cfg.precision != "fp32" and not use_cpu(cfg) else None,
        # One generation of `rows` rows per optimizer step, trained micro rows at a time.
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,
        steps_per_generation=rows // micro,
        use_vllm=cfg.generator == "vllm",
        **vllm,
        num_generations=cfg.group_size,
        max_completion_length=cfg.completion_budget(),
        max_steps=cfg.steps,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",  # the warm-up: lr_schedule.trl_callback, the built-in trainer's shape
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        temperature=cfg.temperature,
        top_p=1.0,
        top_k=0,
        beta=cfg.loss.beta,
        epsilon=cfg.loss.eps_low,
        epsilon_high=cfg.loss.eps_high,
        delta=cfg.loss.dual_clip_c,
        loss_type=AGGREGATION_TO_LOSS_TYPE[cfg.loss.aggregation],
        scale_rewards=cfg.advantage_scale,
        **reward_weights(cfg),
        report_to=cfg.report_to.split(","),
        save_strategy="steps" if cfg.checkpoint_every else "no",
        save_steps=cfg.checkpoint_every or 500,
        save_total_limit=cfg.keep_checkpoints,
        logging_steps=1,
        seed=cfg.seed,
        disable_tqdm=not cfg.progress,
        replay_preset=cfg.preset,
        **trl_replay_kwargs(cfg.replay_overrides()),
    )


def callbacks(cfg: TrainConfig, evaluate_fn: Callable[[Any], dict[str, Any]]) -> list:
    """The run's TrainerCallbacks: periodic held-out evaluation, the non-finite step guard, metrics.jsonl."""
    from transformers import TrainerCallback

    class HeldoutEvals(TrainerCallback):
        """Evaluate every eval_every steps (not at the end: the command evaluates the final model itself)."""

        def on_step_end(self, args, state, control, model=None, **_):
            step = state.global_step
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                import torch

                was_training = model.training
                # evaluate() forks the CPU generator only; training's CUDA samples must not depend on eval_every.
                with torch.random.fork_rng(devices=[model.device] if model.device.type == "cuda" else []):
                    row = evaluate_fn(model)
                model.train(was_training)
                append_eval(cfg.run_dir, step, cfg, row)

    class NonFiniteGuard(TrainerCallback):
        """The built-in trainer's max_bad_steps: skip the update of a step whose gradients are not finite (no
        parameter or optimizer-state change) and stop, with a checkpoint, after max_bad_steps in a row."""

        def __init__(self) -> None:
            self.in_a_row, self.stopped_at = 0, None

        def on_pre_optimizer_step(self, args, state, control, model=None, **_):
            import torch

            grads = [p.grad for p in model.parameters() if p.grad is not None]
            if all(bool(torch.isfinite(g).all()) for g in grads):
                self.in_a_row = 0
                return
            for p in model.parameters():
                p.grad = None  # AdamW skips parameters without a gradient
            self.in_a_row += 1

        def on_step_end(self, args, state, control, **_):
            if self.in_a_row >= cfg.max_bad_steps:
                self.stopped_at = state.global_step
                control.should_training_stop = True
                control.should_save = True

    from .metrics import callback as metrics_log

    from ..lr_schedule import trl_callback as warmup

    return [HeldoutEvals(), NonFiniteGuard(),
            metrics_log(cfg.run_dir, cfg.prompts_per_step * cfg.group_size, reward_names=cfg.reward_funcs),
            warmup(cfg.lr_warmup_steps)]


def raise_if_stopped(cfg: TrainConfig, trainer) -> None:
    from ..stopping import TrainingStopped

    guard = next((c for c in trainer.callback_handler.callbacks if type(c).__name__ == "NonFiniteGuard"), None)
    if guard is not None and guard.stopped_at is not None:
        raise TrainingStopped(
            f"{cfg.max_bad_steps} consecutive steps had non-finite gradients (last at step {guard.stopped_at}); "
            f"checkpoint written to {cfg.run_dir}. Lower TrainConfig.lr or check the reward/model."
        )


def append_eval(run_dir: Path, step: int, cfg: TrainConfig, row: dict[str, Any]) -> None:
    from ..rundir import RunDir

    RunDir(run_dir).log_eval({"step": step, "generated": step * cfg.prompts_per_step * cfg.group_size, **row})
