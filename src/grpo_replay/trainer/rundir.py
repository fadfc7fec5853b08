"""The run directory: `RunDir`, the one owner of a run's files, and `claim`, which checks and locks it before any
compute.

`RunDir` writes every file a run has (their names are `app.run_files`', shared with the layers that read them): the
metrics and evaluation logs (metrics.jsonl, evals.jsonl: appended a row a step, trimmed to the checkpoint's step on
resume, read back tolerantly), the checkpoints (`checkpoint.py` writes one; a full disk becomes a `CheckpointError`
that says what to do) and summary.json.

`claim(cfg)` is held for the whole run (built-in trainer and `--backend trl`) and yields the `RunDir`:
  - the path must be usable: not empty, not a file, not under a file, writable;
  - the directory must be empty, new, or a grpo-replay run (it holds the marker file `.grpo-replay-run`);
    a directory with anyone else's files is never written into;
  - one run at a time: `.grpo-replay.lock` is locked (flock) for the run's life and names the holder's pid;
    the kernel drops the lock when its process dies, so the lock of a killed run is taken over;
  - resuming a run with results (a checkpoint or a summary): the requested config must equal the config the run
    was made with (the one its newest checkpoint carries, else its config.yaml; a run with neither is refused)
    except for `RESUMABLE_KEYS`; otherwise nothing is written and the error lists the keys that differ.
Only then is config.yaml (re)written.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

import yaml

from .. import __version__
from ..app import configio, jsonl
from ..app.run_files import CONFIG, EVALS, LOCK, MARKER, METRICS, SUMMARY, TRL_CHECKPOINT_PREFIX, TRL_SUMMARY, is_ours
from ..app.provenance import provenance
from ..errors import UsageError
from . import checkpoint
from .stopping import CheckpointError

# Keys that may change when a run is resumed: they change how long it runs, how often it evaluates, logs and
# checkpoints, and where things are, not what one step computes. Any other difference refuses the resume.
RESUMABLE_KEYS = (
    "steps",
    "eval_every",
    "checkpoint_every",
    "keep_checkpoints",
    "max_bad_steps",
    "reward_timeout",
    "progress",
    "report_to",
    "out_dir",
    "testbed.cache_dir",
    "testbed.progress_every",
)


class RunDirError(UsageError):
    """The run directory cannot be used (bad path, foreign files, in use, or a changed config on resume)."""


def file_in_the_way(path: Path) -> Optional[Path]:
    """What keeps `path` from being (or becoming) a directory: the path itself when it is a file, or its nearest
    existing parent when that is a file; None when nothing does."""
    if path.exists() and not path.is_dir():
        return path
    for parent in path.absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def check_path(out_dir: str, run_dir: Path) -> None:
    """Refuse an out_dir that cannot hold a run, without writing anything."""
    if not out_dir.strip():
        raise RunDirError("TrainConfig.out_dir is empty; give a directory for the run (e.g. --out runs/my-run)")
    blocker = file_in_the_way(run_dir)
    if blocker == run_dir:
        raise RunDirError(f"TrainConfig.out_dir={str(run_dir)!r} is a file, not a directory")
    if blocker is not None:
        raise RunDirError(f"TrainConfig.out_dir={str(run_dir)!r} lies under {str(blocker)!r}, which is a file")


def _foreign_files(run_dir: Path) -> list[str]:
    """Entries of an existing directory that make it someone else's (empty when it is ours, new or empty)."""
    if not run_dir.is_dir() or (run_dir / MARKER).is_file():
        return []
    names = sorted(p.name for p in run_dir.iterdir())
    if not names:
        return []
    if CONFIG in names and all(map(is_ours, names)) and _is_train_config(run_dir / CONFIG):
        return []
    return names


def _is_train_config(path: Path) -> bool:
    from .train_config import resolve

    try:
        resolve(yaml_path=str(path))
    except (ValueError, TypeError, RecursionError):
        return False
    return True


def config_diff(saved, requested) -> dict[str, tuple[Any, Any]]:
    """key -> (run's value, requested value) for every key outside RESUMABLE_KEYS that differs."""
    a, b = saved.flat(), requested.flat()
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if k not in RESUMABLE_KEYS and a.get(k) != b.get(k)}


def _check_resume(cfg, run: "RunDir") -> int:
    """Refuse a resume that would mix two runs; returns the steps the run has done (0 for a new run)."""
    past = run.history()
    if not past.has_results:
        # No results yet (setup failed, or killed before the first checkpoint): the run starts over, so any config may.
        return 0
    saved = run.saved_config()
    _check_trackers(saved.report_to, cfg.report_to, run, past.done)
    diff = config_diff(saved, cfg)
    if diff:
        lines = "\n".join(f"  {k}: {old!r} (run) -> {new!r} (requested)" for k, (old, new) in diff.items())
        raise RunDirError(
            f"{run} holds a run made with a different config; resuming it would mix two runs. Keys that differ:\n"
            f"{lines}\nOnly these keys may change on resume: {', '.join(RESUMABLE_KEYS)}. "
            f"To run the new config, give a new directory: --out NEWDIR"
        )
    if cfg.steps < past.done:
        raise RunDirError(
            f"TrainConfig.steps={cfg.steps} is below the {past.done} steps the run in {run} has already done; "
            f"allowed: steps >= {past.done} (or --out NEWDIR for a new run)"
        )
    if cfg.steps > past.done > past.resumable:  # a finished run without a checkpoint at its end (TRL, checkpoint_every=0)
        raise RunDirError(
            f"TrainConfig.steps={cfg.steps}: the run in {run} finished its {past.done} steps without a checkpoint at "
            f"step {past.done}, so it cannot be continued; allowed: steps = {past.done} (or --out NEWDIR for a new run)"
        )
    return past.done


def _check_trackers(made: str, asked: str, run: "RunDir", done: int) -> None:
    """Refuse a tracker the run was not made with (as compare does): it would hold only the steps after the
    checkpoint, without the earlier ones or the step-0 evaluation. Dropping a tracker is allowed."""
    added = [t for t in asked.split(",") if t != "none" and t not in made.split(",")]
    if added:
        raise RunDirError(
            f"TrainConfig.report_to={asked!r} adds {','.join(added)} to the run in {run}, made with report_to={made!r} "
            f"({done} steps done): a tracker cannot get a run's earlier rows afterwards (they are in metrics.jsonl and "
            f"evals.jsonl, which grpo-replay plot reads); allowed: report_to={made} or fewer of its trackers, or "
            "--out NEWDIR for a new run with the tracker")


class RunHistory(NamedTuple):
    """What a run directory holds from earlier runs, read in one pass (`RunDir.history`)."""

    has_checkpoint: bool  # a complete built-in checkpoint `ckpt-<step>/`
    checkpoint_step: int  # the newest one's step (0: none)
    trl_checkpoint_steps: tuple[int, ...]  # TRL's own `checkpoint-N` folders (--backend trl with a real model)
    summary_steps: int  # the steps a finished run's summary.json records (0: none, or unreadable)
    has_summary: bool  # summary.json or trl_summary.json exists (readable or not)
    has_trl_entries: bool  # anything named checkpoint-* (TRL's, complete or not)

    @property
    def has_results(self) -> bool:
        return self.has_checkpoint or self.has_summary or self.has_trl_entries

    @property
    def resumable(self) -> int:
        """The step a resume continues from (its newest checkpoint of either kind)."""
        return max(self.checkpoint_step, *self.trl_checkpoint_steps, 0)

    @property
    def done(self) -> int:
        return max(self.resumable, self.summary_steps)


def holds_run(directory: Path) -> bool:
    """Whether `directory` is a grpo-replay run directory (marked, or only grpo-replay's files with a config.yaml)."""
    return directory.is_dir() and ((directory / MARKER).is_file()
                                   or ((directory / CONFIG).is_file() and not _foreign_files(directory)))


def _refuse_foreign(run_dir: Path) -> None:
    foreign = _foreign_files(run_dir)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise RunDirError(
            f"TrainConfig.out_dir={str(run_dir)!r} holds files grpo-replay did not make ({shown}); "
            f"give an empty or new directory"
        )


def _write_marker(run_dir: Path) -> None:
    (run_dir / MARKER).write_text(json.dumps({"made_by": "grpo-replay", "version": __version__}) + "\n")


def mark(run_dir: Path) -> None:
    """Create run_dir as a grpo-replay run directory, for a caller that writes into it before `claim`
    (the compare runner's train.log); a directory with anyone else's files is refused."""
    _refuse_foreign(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / MARKER).is_file():
        _write_marker(run_dir)


def _holder(lock: Path) -> str:
    # The holder writes its pid right after taking the lock: wait briefly for it.
    for _ in range(20):
        try:
            pid = json.loads(lock.read_text()).get("pid")
            if pid:
                return f"pid {pid}"
        except (OSError, ValueError, AttributeError):
            pass
        time.sleep(0.05)
    return "pid unknown"


def _lock(fd: int, lock: Path, in_use: str) -> None:
    """Take the flock of the open `lock` file without waiting and write our pid into it; when another process holds
    it, raise RunDirError(f"{in_use} ({holder's pid}); wait for it to end or give another --out")."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunDirError(f"{in_use} ({_holder(lock)}); wait for it to end or give another --out") from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "since": time.time()}).encode())


@contextlib.contextmanager
def exclusive(directory: Path, name: str, what: str) -> Iterator[Path]:
    """Hold `directory/name` locked for the block: one `what` (e.g. "grpo-replay compare") at a time in directory.
    The kernel drops the lock when its process dies, so a killed holder's lock is taken over."""
    lock = Path(directory) / name
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunDirError(f"{directory} is not writable: {e.strerror or e}") from None
    try:
        _lock(fd, lock, f"{directory} is in use by another {what}")
        yield Path(directory)
    finally:
        os.close(fd)  # closing the descriptor releases the lock


class RunDir:
    """One run directory's files: the only code that writes them (their names: `app.run_files`). Path-like
    (`Path(run)`, `run / "x"`, `str(run)`).

    metrics.jsonl, evals.jsonl: a row appended per step / evaluation (and sent to the run's trackers), read
    tolerantly (`app.jsonl`), trimmed to the checkpoint's step on resume; checkpoints `ckpt-<step>/`
    (`checkpoint.py`); summary.json with the code's provenance."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.metrics, self.evals, self.summary = self.path / METRICS, self.path / EVALS, self.path / SUMMARY

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (RunDir, Path)) and Path(other) == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    def log_metrics(self, row: dict[str, Any], tracker=None) -> None:
        """One step's metrics row, into metrics.jsonl and the report_to trackers (None: the file only)."""
        _log(self.metrics, row, tracker)

    def log_eval(self, row: dict[str, Any], tracker=None) -> None:
        """One evaluation's row, into evals.jsonl and the report_to trackers."""
        _log(self.evals, row, tracker)

    def read_metrics(self) -> list[dict[str, Any]]:
        return jsonl.read_metrics(self.metrics)

    def read_evals(self) -> list[dict[str, Any]]:
        return jsonl.read(self.evals)

    def keep_logs_to(self, step: int) -> None:
        """Drop the log rows after `step` (-1: every row): a resumed run redoes the steps after its checkpoint, so
        the logs then match an uninterrupted run's. An evaluation at the checkpoint's own step was written before
        the checkpoint: it is kept."""
        jsonl.truncate(self.metrics, step)
        jsonl.truncate(self.evals, step)

    def checkpoints(self) -> list[Path]:
        """The complete built-in checkpoints `ckpt-<step>/`, oldest first."""
        return checkpoint.list_checkpoints(self.path)

    def latest_checkpoint(self) -> Optional[Path]:
        return checkpoint.latest(self.path)

    def history(self) -> RunHistory:
        """What earlier runs left here: checkpoints of both trainers and the summary (`RunHistory`)."""
        newest = self.latest_checkpoint()
        trl_entries = list(self.path.glob(TRL_CHECKPOINT_PREFIX + "*"))
        trl = sorted(int(p.name.split("-")[1]) for p in trl_entries if p.is_dir() and p.name.split("-")[1].isdigit())
        steps = (self.read_summary() or {}).get("steps", 0)
        return RunHistory(
            has_checkpoint=newest is not None,
            checkpoint_step=int(newest.name.split("-")[1]) if newest is not None else 0,
            trl_checkpoint_steps=tuple(trl),
            summary_steps=steps if isinstance(steps, int) else 0,
            has_summary=self.summary.is_file() or (self.path / TRL_SUMMARY).is_file(),
            has_trl_entries=bool(trl_entries),
        )

    def saved_config(self):
        """The `TrainConfig` a run with results was made with: the one its newest readable checkpoint carries (what
        a resume continues), else its config.yaml; a run with neither is refused, since a resume could not be
        checked."""
        from .train_config import resolve

        for ckpt in reversed(self.checkpoints()):
            try:
                text = checkpoint.saved_config(ckpt)
            except checkpoint.DamagedCheckpoint:
                continue  # the resume falls back past it too, and names it
            if text is not None:
                try:
                    return resolve(configio.flatten(configio.yaml_load(text)))
                except (ValueError, TypeError, RecursionError, AttributeError, yaml.YAMLError):
                    continue  # damaged, like an unreadable file
        path = self.path / CONFIG
        if not path.is_file():
            raise RunDirError(
                f"{self} holds a run's results but no config.yaml (and no checkpoint carrying its {checkpoint.CONFIG}), "
                f"so a resume cannot be checked against the config it was made with; restore {path} or give another "
                f"--out")
        try:
            return resolve(yaml_path=str(path))
        except (ValueError, TypeError, RecursionError) as e:
            raise RunDirError(f"{self} holds a run whose config.yaml cannot be read ({e}); use another --out") from None

    def load_checkpoint(self, *live, drift=None) -> tuple[Optional[Path], Optional[dict[str, Any]]]:
        """`checkpoint.load_latest` into the live model, optimizer, scheduler, buffer and prompt_rng."""
        return checkpoint.load_latest(self.path, *live, drift=drift)

    def save_checkpoint(self, step: int, state: dict, keep: int, *, model, tokenizer, optimizer, scheduler, buffer,
                        prompt_rng, drift=None, config_yaml: Optional[str] = None) -> Path:
        """`checkpoint.save` of the completed `step`, an OSError (e.g. a full disk) turned into a CheckpointError
        that says what to do."""
        try:
            return checkpoint.save(self.path, step, model, tokenizer, optimizer, scheduler, buffer, prompt_rng, state,
                                   keep=keep, drift=drift, config_yaml=config_yaml)
        except OSError as e:
            prev = self.latest_checkpoint()
            intact = f"previous checkpoint {prev.name} is intact" if prev else "there is no previous checkpoint"
            todo = "Free disk space, then rerun" if e.errno == errno.ENOSPC else "Rerun"
            raise CheckpointError(
                f"checkpoint at step {step} failed: {e.strerror or e}; {intact} in {self.path}. "
                f"{todo} the same command to resume from the last checkpoint."
            ) from e

    def write_summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        """summary.json, with the provenance of the code the run finished with (a resumed run may have started on
        other code); returns the summary written."""
        summary = {**summary, "provenance": provenance()}
        self.summary.write_text(json.dumps(summary, indent=1, default=str))
        return summary

    def read_summary(self) -> Optional[dict[str, Any]]:
        """summary.json of a finished run; None when there is none or it cannot be read."""
        try:
            summary = json.loads(self.summary.read_text())
        except (OSError, ValueError):
            return None
        return summary if isinstance(summary, dict) else None


def _log(path: Path, row: dict[str, Any], tracker) -> None:
    jsonl.append(path, row)
    if tracker is not None:
        tracker.log(row)


@contextlib.contextmanager
def claim(cfg) -> Iterator[RunDir]:
    """Check, lock and prepare cfg.run_dir (see the module docstring); yields its RunDir, unlocks on exit."""
    run_dir = cfg.run_dir
    check_path(cfg.out_dir, run_dir)
    _refuse_foreign(run_dir)
    run = RunDir(run_dir)
    _check_resume(cfg, run)  # before writing anything, even the lock's pid; again under the lock below
    created = not run_dir.exists()
    lock = run_dir / LOCK
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunDirError(f"TrainConfig.out_dir={str(run_dir)!r} is not writable: {e.strerror or e}") from None
    try:
        _lock(fd, lock, f"{run_dir} is in use by another grpo-replay run")
        try:
            done = _check_resume(cfg, run)  # under the lock: no other run can change config.yaml meanwhile
        except RunDirError:
            if created:
                os.unlink(lock)
                with contextlib.suppress(OSError):
                    run_dir.rmdir()
            raise
        try:
            _write_marker(run_dir)
            (run_dir / CONFIG).write_text(cfg.to_yaml())
        except OSError as e:
            raise RunDirError(f"TrainConfig.out_dir={str(run_dir)!r} is not writable: {e.strerror or e}") from None
        if cfg.backend == "builtin" and done >= cfg.steps:
            print(
                f"grpo-replay: {run_dir} has already done its {done} steps; nothing to train. To continue it, raise "
                f"steps (--steps N); to re-run its config from scratch: grpo-replay train --config "
                f"{run_dir / CONFIG} --out NEWDIR",
                file=sys.stderr,
                flush=True,
            )
        yield run
    finally:
        os.close(fd)  # closing the descriptor releases the lock
