"""What share of replay rows a `ReplayGRPOTrainer` realises under TRL's split, known at construction.

TRL splits each process's generation (per_device_train_batch_size x steps_per_generation fresh rows) into
steps_per_generation micro-batches and drops the rows beyond a multiple; the trainer trims replay rows to keep
the composed batch a multiple (`replay_share`). A configuration whose planned replay rows are not such a multiple
would replay fewer rows than replay_ratio at every step (none at one fresh row per micro-batch and ratio 0.5: the
paper arm would be GRPO), so it is refused before anything is trained, with the batch settings that realise it.
"""
from __future__ import annotations

import warnings

from ...config import ReplayConfig
from ...errors import ConfigError
from ...replay_share import Share, realised_share, units_that_realise


def check_share(args, cfg: ReplayConfig, num_processes: int) -> Share:
    """The `Share` of one process's step (a full buffer after warm-up); ConfigError naming the fields and the
    settings that realise the ratio when TRL's split would trim planned replay rows."""
    spg = int(args.steps_per_generation)
    fresh = int(args.generation_batch_size) // num_processes
    share = realised_share(fresh, cfg, spg)
    if cfg.fill_filtered and spg > 1:
        warnings.warn(f"ReplayGRPOTrainer: with replay_fill_filtered the replay rows per generation vary; TRL's split "
                      f"into steps_per_generation={spg} micro-batches trims up to {spg - 1} of them per process")
    elif not share.realised:
        ok = units_that_realise(fresh, cfg, [u for u in range(1, fresh + 1) if fresh % u == 0])
        ok.sort(key=lambda u: (u > spg, -u if u <= spg else u))  # the fewest extra rows per micro-batch first
        fixes = ", ".join(f"per_device_train_batch_size={fresh // u} with steps_per_generation={u}" for u in ok[:3])
        raise ConfigError(
            f"ReplayGRPOTrainer: per_device_train_batch_size={args.per_device_train_batch_size} x "
            f"steps_per_generation={spg} = {fresh} fresh rows per process with replay_ratio={cfg.replay_ratio} "
            f"({cfg.composition}) compose {share.kept} + {share.planned} rows; TRL splits them into {spg} micro-batches "
            f"and drops the rows beyond a multiple, so only {share.replay} replay rows would train (share "
            f"{share.share:.3f} instead of {share.configured:.3f}); allowed: {fixes} (gradient_accumulation_steps = "
            "steps_per_generation keeps one optimizer step per generation), or a replay_ratio that makes the replay "
            "rows a multiple of steps_per_generation")
    return share
