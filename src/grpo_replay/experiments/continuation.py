"""Continuing a finished shorter run instead of training a longer one from step 0.

A run of `steps = S` whose config equals a finished run's in every key but the ones that only say how long it runs
and where its files go (`_same_run_except`) is that run's first `S0` steps followed by `S - S0` more: the trainer
resumes a run with more steps from its final checkpoint (`trainer/rundir.py`, `RESUMABLE_KEYS`), and a resumed run
equals an uninterrupted one. So `compare` copies the finished run's directory (checkpoints and logs, not its
summary or plots) into the longer run's and lets the trainer resume there; the shorter run stays as it was, for
the reports that read it. The copy records where it came from in `run_files.CONTINUED` (the source's directory,
steps and the code it was made with: a continued run's first steps may be another commit's).

A source qualifies only when its steps are a multiple of the run's eval_every (or eval_every is 0): the final
evaluation of a run happens at its last step, so a source that ended between two scheduled evaluations would
leave one evaluation that an uninterrupted run does not make. It must have a checkpoint at its last step.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Optional

from ..app import configio
from ..app.run_files import CONFIG, CONTINUED, LOCK, SUMMARY
from ..trainer.rundir import RunDir
from ..trainer.train_config import resolve
from .run_hash import UNHASHED

_NOT_COPIED = (SUMMARY, LOCK)


def lineage(overrides: dict) -> str:
    """A hash of the resolved config without `_same_run_except()`: runs with equal lineage differ only in length."""
    return _digest(configio.flatten(resolve(overrides).to_dict()))


def _same_run_except() -> tuple[str, ...]:
    """Keys that may differ between a run and the shorter run it continues: `steps` and the keys no run's results
    depend on (`run_hash.UNHASHED`; each is also a trainer `RESUMABLE_KEYS` key, so the trainer accepts the resume);
    every other key, eval_every and drift_probe included, must be equal."""
    return ("steps", *UNHASHED)


def _digest(flat: dict) -> str:
    skip = _same_run_except()
    kept = {k: v for k, v in flat.items() if k not in skip}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _saved_lineage(run_dir: Path) -> Optional[str]:
    try:
        return _digest(configio.flatten(resolve(yaml_path=str(run_dir / CONFIG)).to_dict()))
    except (OSError, ValueError, TypeError):
        return None  # unreadable or made by a config this code refuses: not a source


def find_source(run_dir: Path, seed: int, key: str, steps: int, eval_every: int) -> Optional[Path]:
    """The finished run with the most steps below `steps` among `<out>/runs/*/seed<seed>-*` (any arm: an arm that
    only runs longer has its own name) whose lineage is `key` and which can be continued; None when there is none."""
    best, best_steps = None, 0
    for cand in sorted(Path(run_dir).parent.parent.glob(f"*/seed{seed}-*")):
        if cand == Path(run_dir) or not (cand / SUMMARY).is_file():
            continue
        hist = RunDir(cand).history()
        done = hist.summary_steps
        if not best_steps < done < steps or hist.checkpoint_step != done or (eval_every and done % eval_every):
            continue
        if _saved_lineage(cand) == key:
            best, best_steps = cand, done
    return best


def continue_from(source: Path, run_dir: Path) -> None:
    """Copy `source` into the new `run_dir` (not its summary, lock or plots) and record the source in CONTINUED;
    the trainer then resumes there from the source's final checkpoint."""
    summary = json.loads((Path(source) / SUMMARY).read_text())
    tmp = Path(str(run_dir) + ".continuing")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=lambda d, names: [n for n in names if n in _NOT_COPIED or n.endswith(".png")])
    (tmp / CONTINUED).write_text(json.dumps({"from": str(source), "steps": summary.get("steps"),
                                             "provenance": summary.get("provenance")}, indent=1))
    tmp.rename(run_dir)  # a copy cut short stays `.continuing`, never a half run the trainer would resume


def continued_commit(run_dir: Path) -> Optional[str]:
    """The commit a continued run's first steps were made at (None for a run that was not continued)."""
    try:
        info = json.loads((Path(run_dir) / CONTINUED).read_text())
    except (OSError, ValueError):
        return None
    return ((info.get("provenance") or {}).get("commit")) or None
