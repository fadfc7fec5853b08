"""Atomic, pickle-free checkpoints: model (safetensors), optimizer and scheduler (torch, weights_only),
replay buffer (npz + json), every random generator and the step (json), the drift probe and its recent
log-probs when the diagnostic is on (safetensors).

A checkpoint is written into `ckpt-<step>.tmp/`, each file flushed and fsynced, then renamed to
`ckpt-<step>/` in one `os.replace`; a crash mid-write leaves only a `.tmp` folder, which loading ignores,
so the previous checkpoint stays valid. The last `keep` checkpoints are kept.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ..app.run_files import CHECKPOINT_PREFIX, CONFIG as RUN_CONFIG, checkpoint_name
from ..errors import UsageError
from ..buffer import ReplayBuffer

DONE = "trainer_state.json"  # written last: its presence marks a complete checkpoint
DRIFT = "drift.safetensors"  # the drift probe and its kept log-probs (TrainConfig.drift_probe > 0)
MODEL = "model"  # the model and tokenizer (save_pretrained)
CONFIG = RUN_CONFIG  # the config the checkpoint was made with, under the run's own name for it


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb+") as f:
                os.fsync(f.fileno())


def rng_state(prompt_rng: np.random.Generator) -> dict[str, Any]:
    return {"numpy_prompt": prompt_rng.bit_generator.state, "python": _py_state()}


def _py_state() -> list:
    v, state, gauss = random.getstate()
    return [v, list(state), gauss]


def _torch_save(obj: Any, path: Path) -> None:
    # Through a Python file object: given a path, torch's own writer reports a full disk as a RuntimeError
    # ("unexpected pos ..."), where a Python write raises OSError(ENOSPC), which the trainer explains.
    with open(path, "wb") as f:
        torch.save(obj, f)


def _os_error(e: Exception) -> OSError | None:
    """The OSError inside a safetensors error (its message ends in "(os error 28)" for a full disk), if any."""
    m = re.search(r"\(os error (\d+)\)", str(e))
    return OSError(int(m.group(1)), os.strerror(int(m.group(1)))) if m else None


def save(
    run_dir: Path,
    step: int,
    model,
    tokenizer,
    optimizer: torch.optim.Optimizer,
    scheduler,
    buffer: ReplayBuffer,
    prompt_rng: np.random.Generator,
    trainer_state: dict[str, Any],
    keep: int = 2,
    drift=None,
    config_yaml: Optional[str] = None,
) -> Path:
    """Write checkpoint `step` (the number of completed steps) atomically; prune older ones. `config_yaml`, the
    run's config, is stored with it, so a resume is checked against the config the checkpoint was made with."""
    final = run_dir / checkpoint_name(step)
    tmp = run_dir / f"{checkpoint_name(step)}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        try:
            _write(tmp, step, model, tokenizer, optimizer, scheduler, buffer, prompt_rng, trainer_state, drift, config_yaml)
        except Exception as e:
            os_error = None if isinstance(e, OSError) else _os_error(e)
            if os_error is None:
                raise
            raise os_error from e
        _fsync_tree(tmp)
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write(tmp: Path, step: int, model, tokenizer, optimizer, scheduler, buffer, prompt_rng, trainer_state, drift,
           config_yaml) -> None:
    model.save_pretrained(tmp / MODEL, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / MODEL)
    _torch_save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optim.pt")
    _torch_save({"cpu": torch.get_rng_state(), "cuda": _cuda_states()}, tmp / "torch_rng.pt")
    buffer.save(tmp / "buffer")
    (tmp / "rng.json").write_text(json.dumps(rng_state(prompt_rng)))
    if drift is not None:
        from safetensors.torch import save_file

        save_file(drift.state_dict(), str(tmp / DRIFT))
    if config_yaml is not None:
        (tmp / CONFIG).write_text(config_yaml)
    (tmp / DONE).write_text(json.dumps({"step": step, **trainer_state}))


def _cuda_states() -> list[torch.Tensor]:
    return torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.glob(CHECKPOINT_PREFIX + "*") if p.is_dir() and not p.name.endswith(".tmp") and (p / DONE).is_file())


def latest(run_dir: Path) -> Optional[Path]:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


class DamagedCheckpoint(ValueError):
    """A file of a complete-looking checkpoint cannot be read (truncated, not JSON, ...); names the file."""

    def __init__(self, file: Path, reason: str):
        self.file = file
        parts = file.parts
        start = max((i for i, part in enumerate(parts) if part.startswith(CHECKPOINT_PREFIX)), default=len(parts) - 1)
        self.name = "/".join(parts[start:])  # e.g. ckpt-000004/model/model.safetensors
        super().__init__(f"{self.name} is damaged ({reason})")


def _read(file: Path, read):
    """read(file), any failure to read it a DamagedCheckpoint naming the file."""
    try:
        return read(file)
    except Exception as e:  # safetensors, torch's zip reader, json and numpy each raise their own kinds
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DamagedCheckpoint(file, f"{type(e).__name__}: {first[:200]}") from e


def saved_config(path: Path) -> Optional[str]:
    """The config.yaml text checkpoint `path` was made with (None for a checkpoint made before they carried one)."""
    f = path / CONFIG
    return _read(f, lambda p: p.read_text(encoding="utf-8")) if f.exists() else None


def read(path: Path, buffer_config, drift: bool = False) -> dict[str, Any]:
    """Every file of checkpoint `path` read whole (`drift`: its drift probe too, when it has one): what `load`
    restores. A file that does not read back raises DamagedCheckpoint naming it."""
    from safetensors.torch import load_file

    def torch_load(p: Path):
        return torch.load(p, weights_only=True)

    files = {"weights": _read(path / MODEL / "model.safetensors", lambda p: load_file(str(p))),
             "opt": _read(path / "optim.pt", torch_load), "rng": _read(path / "torch_rng.pt", torch_load),
             "buffer": _read(path / "buffer", lambda p: ReplayBuffer.load(p, config=buffer_config)),
             "states": _read(path / "rng.json", lambda p: json.loads(p.read_text())),
             "drift": _read(path / DRIFT, lambda p: load_file(str(p))) if drift and (path / DRIFT).is_file() else None,
             "trainer_state": _read(path / DONE, lambda p: json.loads(p.read_text()))}
    if not isinstance(files["trainer_state"], dict) or not isinstance(files["trainer_state"].get("step"), int):
        raise DamagedCheckpoint(path / DONE, "no step in it")
    return files


def load(
    path: Path, model, optimizer, scheduler, buffer: ReplayBuffer, prompt_rng: np.random.Generator, drift=None
) -> dict[str, Any]:
    """Restore everything `save` wrote into the given live objects; returns the trainer state. Every file is read
    (`read`) before anything is restored, so a DamagedCheckpoint (naming the file) leaves the live objects as they
    were."""
    files = read(path, buffer.config, drift is not None)
    weights, opt, rng, loaded, states = (files[k] for k in ("weights", "opt", "rng", "buffer", "states"))
    drift_state, trainer_state = files["drift"], files["trainer_state"]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied embeddings are saved once; anything else missing means a different model.
    missing = [k for k in missing if "lm_head" not in k]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    _read(path / "optim.pt", lambda p: (optimizer.load_state_dict(opt["optimizer"]), scheduler.load_state_dict(opt["scheduler"])))

    def set_rngs(p: Path) -> None:
        torch.set_rng_state(rng["cpu"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])

    _read(path / "torch_rng.pt", set_rngs)
    buffer.__dict__.update(loaded.__dict__)

    def set_py_rngs(p: Path) -> None:
        prompt_rng.bit_generator.state = states["numpy_prompt"]
        v, st, gauss = states["python"]
        random.setstate((v, tuple(st), gauss))

    _read(path / "rng.json", set_py_rngs)
    if drift_state is not None:
        drift.load_state_dict(drift_state)
    return trainer_state


class NoUsableCheckpoint(UsageError):
    """Every checkpoint of a run directory is damaged: the run cannot resume (a rerun would fail the same way)."""


def load_latest(run_dir: Path, *live, drift=None) -> tuple[Optional[Path], Optional[dict[str, Any]]]:
    """`load` the newest checkpoint that reads back whole, warning about each newer damaged one (naming its file);
    (None, None) without checkpoints. `live` are `load`'s model, optimizer, scheduler, buffer and prompt_rng."""
    path, state, damaged = _newest(run_dir, lambda p: load(p, *live, drift=drift))
    for e in damaged:
        print(f"grpo-replay: warning: {e}; resuming from {path.name}, the newest complete checkpoint", file=sys.stderr,
              flush=True)
    return path, state


def newest_readable(run_dir: Path, buffer_config, drift: bool = False) -> tuple[Optional[Path], list]:
    """(the checkpoint a resume would load, the newer damaged ones) without loading anything: the files `load` reads,
    read the same way (NoUsableCheckpoint when every checkpoint is damaged; (None, []) without checkpoints)."""
    path, _, damaged = _newest(run_dir, lambda p: read(p, buffer_config, drift))
    return path, damaged


def _newest(run_dir: Path, attempt) -> tuple[Optional[Path], Any, list[DamagedCheckpoint]]:
    """`attempt(checkpoint)` newest first until one does not raise DamagedCheckpoint: (it, its result, the damaged
    newer ones); NoUsableCheckpoint when none is whole."""
    damaged: list[DamagedCheckpoint] = []
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return path, attempt(path), damaged
        except DamagedCheckpoint as e:
            damaged.append(e)
    if damaged:
        raise NoUsableCheckpoint(
            f"every checkpoint in {run_dir} is damaged: {'; '.join(map(str, damaged))}. Nothing can resume from them: "
            f"delete them to start the run over, or give another --out")
    return None, None, []
