"""One checkpoint folder per run: what verl's `trainer.resume_mode=auto` would load is said, and refused when another
run wrote it, before Ray starts.

verl resumes the latest `global_step_*` of `trainer.default_local_dir` whenever it finds one. A launch that reuses
another arm's or seed's folder would finish at once with that run's model under its own name. The launch records
what makes a run itself (`grpo_replay_run.json`: model, preset, seeds, trainer) in its folder; a later launch into a
folder with checkpoints must match it.
"""
from __future__ import annotations

import json
import os

RECORD = "grpo_replay_run.json"
LATEST = "latest_checkpointed_iteration.txt"  # verl's pointer to the last global_step_*


def run_identity(config) -> dict:
    """What distinguishes one run of the paper's table from another: model, arm, every seed, trainer."""
    trainer, rollout_ref = config.trainer, config.actor_rollout_ref
    v1 = bool(trainer.get("use_v1", True))
    return {
        "model": str(rollout_ref.model.path),
        "replay.preset": str(config.replay.get("preset")),
        "replay.seed": config.replay.get("seed"),
        "data.seed": config.data.get("seed"),
        "actor_rollout_ref.rollout.seed": rollout_ref.rollout.get("seed"),
        "actor_rollout_ref.actor.data_loader_seed": rollout_ref.actor.get("data_loader_seed"),
        "trainer.use_v1": v1,
        "trainer.v1.trainer_mode": str(trainer.v1.trainer_mode) if v1 else None,
    }


def check_run_folder(config, write: bool = True) -> str:
    """ValueError when `trainer.default_local_dir` holds checkpoints another run recorded and resume_mode would load
    them; else records this run there (when `write`) and returns a line saying whether the launch resumes."""
    folder = os.path.abspath(str(config.trainer.default_local_dir))
    mode = str(config.trainer.get("resume_mode", "auto"))
    me = run_identity(config)
    latest = os.path.join(folder, LATEST)
    step = open(latest).read().strip() if os.path.exists(latest) else None
    record = os.path.join(folder, RECORD)
    theirs = json.load(open(record)) if os.path.exists(record) else None
    if mode == "auto" and step is not None:
        if theirs is not None and theirs != me:
            diff = ", ".join(f"{k}={theirs.get(k)!r} there, {me[k]!r} here" for k in me if theirs.get(k) != me[k])
            raise ValueError(
                f"trainer.default_local_dir={folder} holds checkpoints (global_step_{step}) of another run ({diff}); "
                "trainer.resume_mode=auto would resume that run under this one's name; allowed: a folder of this "
                "run's own (the launchers' EXP / CKPT_ROOT, or trainer.default_local_dir), or "
                "trainer.resume_mode=disable to start over there"
            )
        line = f"checkpoints: {folder}: resumes global_step_{step} (trainer.resume_mode=auto)"
        if theirs is None:
            line += f"; no {RECORD} there, so which run wrote it is not checked"
    elif mode == "auto":
        line = f"checkpoints: {folder}: a fresh run (no checkpoint there)"
    else:
        line = f"checkpoints: {folder}: trainer.resume_mode={mode} (verl's rule: 'disable' starts fresh, " \
               "a path resumes that checkpoint)"
    if write:
        os.makedirs(folder, exist_ok=True)
        with open(record + ".tmp", "w") as f:
            json.dump(me, f, indent=1)
        os.replace(record + ".tmp", record)
    return line
