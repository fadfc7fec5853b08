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
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ..buffer import ReplayBuffer

DONE = "trainer_state.json"  # written last: its presence marks a complete checkpoint
DRIFT = "drift.safetensors"  # the drift probe and its kept log-probs (TrainConfig.drift_probe > 0)


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
) -> Path:
    """Write checkpoint `step` (the number of completed steps) atomically; prune older ones."""
    final = run_dir / f"ckpt-{step:06d}"
    tmp = run_dir / f"ckpt-{step:06d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        model.save_pretrained(tmp / "model", safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "model")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optim.pt")
        torch.save({"cpu": torch.get_rng_state(), "cuda": _cuda_states()}, tmp / "torch_rng.pt")
        buffer.save(tmp / "buffer")
        (tmp / "rng.json").write_text(json.dumps(rng_state(prompt_rng)))
        if drift is not None:
            from safetensors.torch import save_file

            save_file(drift.state_dict(), str(tmp / DRIFT))
        (tmp / DONE).write_text(json.dumps({"step": step, **trainer_state}))
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


def _cuda_states() -> list[torch.Tensor]:
    return torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.glob("ckpt-*") if p.is_dir() and not p.name.endswith(".tmp") and (p / DONE).is_file())


def latest(run_dir: Path) -> Optional[Path]:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def load(
    path: Path, model, optimizer, scheduler, buffer: ReplayBuffer, prompt_rng: np.random.Generator, drift=None
) -> dict[str, Any]:
    """Restore everything `save` wrote into the given live objects; returns the trainer state."""
    from safetensors.torch import load_file

    weights = load_file(str(path / "model" / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied embeddings are saved once; anything else missing means a different model.
    missing = [k for k in missing if "lm_head" not in k]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    opt = torch.load(path / "optim.pt", weights_only=True)
    optimizer.load_state_dict(opt["optimizer"])
    scheduler.load_state_dict(opt["scheduler"])
    rng = torch.load(path / "torch_rng.pt", weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    loaded = ReplayBuffer.load(path / "buffer", config=buffer.config)
    buffer.__dict__.update(loaded.__dict__)
    states = json.loads((path / "rng.json").read_text())
    prompt_rng.bit_generator.state = states["numpy_prompt"]
    v, st, gauss = states["python"]
    random.setstate((v, tuple(st), gauss))
    if drift is not None and (path / DRIFT).is_file():
        drift.load_state_dict(load_file(str(path / DRIFT)))
    return json.loads((path / DONE).read_text())
