"""Experiment trackers for the built-in trainer: `report_to` = none | tensorboard | wandb | trackio (TRL's word).

Every row the trainer appends to metrics.jsonl or evals.jsonl is sent to each tracker under the same names
(nested dicts such as `pass@k` become `pass@k/1`; `buffer/age_hist` becomes a histogram; per-problem raw
lists such as evals' `counts` stay in the JSONL only), at the row's `step`. The resolved config is the run's
hyper-parameters. A resumed run continues the same tracker run:
  - TensorBoard writes to `<run dir>/tensorboard` and, on resume, purges the steps after the checkpoint
    (they are redone), so every step appears once.
  - W&B: the run id is stored in `<run dir>/wandb_run_id` and the resumed process re-attaches to it
    (`resume="allow"`). W&B keeps the values it already has for redone steps (it ignores steps it has seen).
  - Trackio (Hugging Face's local-first tracker): a run of project `$TRACKIO_PROJECT` (default grpo-replay)
    in trackio's own SQLite store (`$TRACKIO_DIR`, default `$HF_HOME/trackio`; `trackio show` opens it),
    named `<run dir name>-<8 random characters>`; the name is stored in `<run dir>/trackio_run` and the
    resumed process continues that run, keeping, like W&B, the values it already has for redone steps.
Trackers are optional extras: `pip install -e '.[track]'` in a grpo-replay checkout (or `[tensorboard]`, `[wandb]`,
`[trackio]`).
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import secrets
import string
from pathlib import Path
from typing import Any, Iterable, Mapping

from . import configio
from .run_files import TENSORBOARD, TRACKIO_NAME_FILE, WANDB_ID_FILE
from ..errors import ConfigError

TRACKERS = ("tensorboard", "wandb", "trackio")
# Module whose presence makes a tracker usable, and the extra that installs it.
_PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "trackio": ("trackio", "trackio")}
# List-valued metrics that are histograms of counts by integer bucket (bucket i = value i).
HISTOGRAMS = ("buffer/age_hist",)


class TrackerError(ConfigError):
    """A bad report_to value or a tracker whose package is not installed."""


def parse_report_to(value: Any, field: str = "TrainConfig.report_to") -> tuple[str, ...]:
    """`none`, a tracker name, a comma/space separated string or a list of names -> tuple of trackers.

    Raises TrackerError naming the field and the allowed values, or the extra to install."""
    if value is None:
        return ()
    items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        if not isinstance(item, str) or item not in ("none",) + TRACKERS:
            raise TrackerError(f"{field}={value!r} is invalid; allowed: none, {', '.join(TRACKERS)} (several: tensorboard,wandb)")
        if item != "none" and item not in names:
            names.append(item)
    if "none" in items and names:
        raise TrackerError(f"{field}={value!r} is invalid: 'none' cannot be combined with a tracker")
    for name in names:
        module, extra = _PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise TrackerError(
                f"{field} includes {name!r} but the {module!r} package is not installed; "
                f"pip install -e '.[{extra}]' in a grpo-replay checkout (or set {field.split('.')[-1]}=none)"
            )
    return tuple(names)


def flat_scalars(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric leaves of a metrics/evals row, dotted with '/'; None, strings and lists are left out."""
    out: dict[str, float] = {}
    for k, v in row.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat_scalars(v, key + "/"))
        elif isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[key] = float(v)
    return out


def hparams(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys -> int/float/str/bool (what TensorBoard's hparams accept; None and lists become text)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, Mapping):
            out.update(hparams(v, f"{prefix}{k}."))
        elif isinstance(v, (bool, int, float, str)):
            out[f"{prefix}{k}"] = v
        else:
            out[f"{prefix}{k}"] = str(v)
    return out


class Tracker:
    """Fans the trainer's rows out to the configured trackers; a no-op for report_to=none."""

    def __init__(self, report_to: Any, run_dir: Path, config: Mapping[str, Any], first_step: int = 0):
        """first_step: the first step this process logs; rows an earlier process logged at or after it are
        superseded (a resume redoes the steps after its checkpoint; 0 = the run starts from scratch)."""
        self.names = parse_report_to(report_to)
        self._tb = self._wandb = self._trackio = None
        self._last: dict[str, tuple[int, float]] = {}
        if "tensorboard" in self.names:
            self._tb = _open_tensorboard(Path(run_dir) / TENSORBOARD, config, first_step)
        if "wandb" in self.names:
            self._wandb = _open_wandb(Path(run_dir), config)
        if "trackio" in self.names:
            self._trackio = _TrackioRun(Path(run_dir), config)

    def log(self, row: Mapping[str, Any]) -> None:
        if not self.names:
            return
        step = int(row["step"])
        # `generated` is in an eval row and the metrics row of the same step: sent once.
        scalars = {k: v for k, v in flat_scalars(row).items() if k != "step" and self._last.get(k) != (step, v)}
        self._last.update({k: (step, v) for k, v in scalars.items()})
        hists = {k: row[k] for k in HISTOGRAMS if isinstance(row.get(k), list) and row[k]}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            for k, counts in hists.items():
                _tb_histogram(self._tb, k, counts, step)
            self._tb.flush()  # a run that stops with an exception must not lose its last rows
        if self._wandb is not None:
            import wandb

            data: dict[str, Any] = dict(scalars)
            for k, counts in hists.items():
                data[k] = wandb.Histogram(np_histogram=(counts, list(range(len(counts) + 1))))
            # An eval row and a metrics row of the same step merge into one W&B step.
            self._wandb.log(data, step=step)
        if self._trackio is not None:
            self._trackio.log(scalars, hists, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._trackio is not None:
            self._trackio.close()
            self._trackio = None


def _open_tensorboard(log_dir: Path, config: Mapping[str, Any], first_step: int):
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams as hparams_summaries

    import yaml

    # purge_step: events of an earlier process at steps >= first_step are hidden (those steps are redone).
    fresh_dir = not any(log_dir.glob("events.out.tfevents.*"))  # e.g. tensorboard added when resuming
    writer = SummaryWriter(str(log_dir), purge_step=first_step)
    if first_step == 0 or fresh_dir:
        # Written into the run's own event file (SummaryWriter.add_hparams would open a separate sub-run).
        for s in hparams_summaries(hparams(config), {"acc_sampled": 0.0, "acc_greedy": 0.0, "reward": 0.0}):
            writer._get_file_writer().add_summary(s)
        writer.add_text("config", "```\n" + yaml.safe_dump(configio.plain(config), sort_keys=False) + "```", 0)
    return writer


def _tb_histogram(writer, tag: str, counts: Iterable[float], step: int) -> None:
    counts = [float(c) for c in counts]
    num = sum(counts)
    if num <= 0:
        return
    values = range(len(counts))
    writer.add_histogram_raw(
        tag,
        min=float(min(i for i, c in zip(values, counts) if c)),
        max=float(max(i for i, c in zip(values, counts) if c)),
        num=num,
        sum=float(sum(i * c for i, c in zip(values, counts))),
        sum_squares=float(sum(i * i * c for i, c in zip(values, counts))),
        bucket_limits=[i + 0.5 for i in values],
        bucket_counts=counts,
        global_step=step,
    )


def _open_wandb(run_dir: Path, config: Mapping[str, Any]):
    import wandb

    id_file = run_dir / WANDB_ID_FILE
    # secrets, not random: drawing from the seeded global generator would change the training run.
    new_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    run_id = id_file.read_text().strip() if id_file.exists() else new_id
    id_file.write_text(run_id + "\n")
    try:
        run = _wandb_init(wandb, run_dir, run_id, config)
    except wandb.errors.UsageError as e:  # e.g. no API key: a message, not a traceback
        raise TrackerError(
            f"report_to=wandb: {e} (or set WANDB_MODE=offline to log locally and `wandb sync` later)"
        ) from None
    offline = run.settings.mode in ("offline", "dryrun")
    print(f"grpo-replay: W&B run {run.id} ({'offline, ' + run.dir if offline else run.url})", flush=True)
    return run


def _wandb_init(wandb, run_dir: Path, run_id: str, config: Mapping[str, Any]):
    return wandb.init(
        project=os.environ.get("WANDB_PROJECT", "grpo-replay"),
        name=str(run_dir),
        id=run_id,
        resume="allow",
        config=configio.plain(config),
        # WANDB_DIR (if set) decides where W&B's files go; otherwise inside the run directory.
        dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
        # Several runs in one process (compare's workers): each train() gets its own W&B run.
        reinit="create_new",
        # W&B's console capture and banners would interleave with the progress bar (_open_wandb prints one line).
        settings=wandb.Settings(console="off", silent=True),
    )


class _TrackioRun:
    """One trackio run of the trainer's rows (a run of several processes when the trainer resumes)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]):
        import trackio
        from trackio.sqlite_storage import SQLiteStorage

        name_file = run_dir / TRACKIO_NAME_FILE
        suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # not the seeded RNG
        name = name_file.read_text().strip() if name_file.exists() else f"{run_dir.name}-{suffix}"
        name_file.write_text(name + "\n")
        self.project = os.environ.get("TRACKIO_PROJECT", "grpo-replay")
        # Steps an earlier process of this run logged keep their values (the resumed process redoes some).
        self.done = SQLiteStorage.get_max_step_for_run(self.project, name)
        with contextlib.redirect_stdout(io.StringIO()):  # trackio's banner would interleave with the progress bar
            self.run = trackio.init(project=self.project, name=name, config=configio.plain(config), resume="allow",
                                    embed=False, auto_log_cpu=False, auto_log_gpu=False)
        where = os.environ.get("TRACKIO_DIR") or "$HF_HOME/trackio"
        print(f"grpo-replay: trackio run {name} in project {self.project} ({where}; `trackio show` opens it)", flush=True)

    def log(self, scalars: Mapping[str, float], hists: Mapping[str, list], step: int) -> None:
        if self.done is not None and step <= self.done:
            return
        import trackio

        data: dict[str, Any] = dict(scalars)
        for k, counts in hists.items():
            data[k] = trackio.Histogram(np_histogram=(counts, list(range(len(counts) + 1))))
        if data:
            self.run.log(data, step=step)

    def close(self) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            self.run.finish()  # waits for trackio's writer thread: every row is in the store after this
