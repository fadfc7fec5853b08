"""The names of the files in a run directory, for every layer that writes or reads one: the trainer's `RunDir`
(trainer/rundir.py), which writes them, and the readers above and beside it (plotting, the experiments, the
commands). A run directory's layout is spelled here only.

The files inside a checkpoint are named by the checkpoint's writer (trainer/checkpoint.py, TRL's own), the
per-figure PNGs by `plotting.training`.
"""
from __future__ import annotations

import re

CONFIG = "config.yaml"  # the resolved TrainConfig; `grpo-replay train --config` takes it back
METRICS = "metrics.jsonl"  # a row a training step
EVALS = "evals.jsonl"  # a row a held-out evaluation
SUMMARY = "summary.json"  # written when the run finishes: its presence marks a finished run
MARKER = ".grpo-replay-run"  # marks a directory as a grpo-replay run's
LOCK = ".grpo-replay.lock"  # flock held for the run's life
TRAIN_LOG = "train.log"  # the run's prints when the compare runner trains it
CONTINUED = ".grpo-replay-continued.json"  # a run that continues a shorter one: {"from", "steps", "provenance"}
CHECKPOINT_PREFIX = "ckpt-"  # the built-in trainer's checkpoints, ckpt-<step, 6 digits>/
TRL_CHECKPOINT_PREFIX = "checkpoint-"  # TRL's checkpoints, checkpoint-<step>/ (--backend trl)
FINAL = "final"  # --backend trl: the trained model
TRL_SUMMARY = "trl_summary.json"  # --backend trl on the testbed: TRL's log history and the replay history
LOG_HISTORY = "log_history.json"  # --backend trl on a real model: TRL's log history
BENCH = "bench"  # compare --model: the run's benchmark results and their generation cache
TENSORBOARD = "tensorboard"  # report_to=tensorboard: the event files
WANDB_DIR = "wandb"  # report_to=wandb: W&B's own files (unless WANDB_DIR is set)
WANDB_ID_FILE = "wandb_run_id"  # report_to=wandb: the W&B run a resumed run re-attaches to
TRACKIO_NAME_FILE = "trackio_run"  # report_to=trackio: the trackio run a resumed run continues

# What grpo-replay writes into a run directory (the per-figure PNGs included): a directory holding only these, and
# a config.yaml that is a TrainConfig, is a run made before the marker existed, and is adopted.
_OURS = re.compile("(?:" + "|".join((
    *(re.escape(n) for n in (CONFIG, METRICS, EVALS, SUMMARY, TRL_SUMMARY, TRAIN_LOG, FINAL, LOG_HISTORY)),
    r"[\w.-]+\.png", TENSORBOARD, WANDB_DIR, WANDB_ID_FILE,
    re.escape(TRL_CHECKPOINT_PREFIX) + r"\d+", re.escape(CHECKPOINT_PREFIX) + r"\d+(\.tmp)?", r"[\w.-]+\.tmp",
    r"\.grpo-replay[\w.-]*",
)) + ")")


def checkpoint_name(step: int) -> str:
    """The folder name of the built-in trainer's checkpoint of `step`."""
    return f"{CHECKPOINT_PREFIX}{step:06d}"


def trl_checkpoint_name(step: int) -> str:
    """The folder name of TRL's checkpoint of `step`."""
    return f"{TRL_CHECKPOINT_PREFIX}{step}"


def is_ours(name: str) -> bool:
    """Whether `name` (one entry of a run directory) is a name grpo-replay writes there."""
    return _OURS.fullmatch(name) is not None
