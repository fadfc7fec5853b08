"""The replay state in verl's checkpoint folders: one save, load and prune for both trainers.

verl writes `<trainer.default_local_dir>/global_step_<t>/` (actor/, data.pt, ...) and then
`latest_checkpointed_iteration.txt`; the replay state is saved beside them as `replay_buffer.*`, before verl's own
save, so the iteration file never points at a folder without a buffer, and once verl's checkpoint is complete the
step folders whose actor checkpoint verl prunes lose theirs (`save_replay`). `load_replay` restores it from the
folder verl resumed from. The state is the legacy trainer's `ReplayHook` (the buffer: `.json`, `.npz`) or v1's
`TQReplayStore` (the buffer and the row store's file): `ReplayState` is what both offer.
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
from typing import Any, Callable, Optional, Protocol, Sequence, TypeVar

logger = logging.getLogger(__name__)
BUFFER_NAME = "replay_buffer"
T = TypeVar("T")


class ReplayState(Protocol):
    """What a trainer's replay state offers its checkpoints (`ReplayHook`, `TQReplayStore`)."""

    settings: Any  # VerlReplaySettings: `allow_empty_resume`
    buffer: Any  # the ReplayBuffer, for its length in the log

    def save(self, path: str) -> None: ...
    def load(self, path: str) -> None: ...
    def files(self, path: str) -> list[str]:
        """Every file `save(path)` writes (`path` + a suffix each)."""
    def saved_layout_problem(self, path: str) -> Optional[str]:
        """Why the files at `path` cannot be resumed by this version (None: they can, or are missing)."""


def save_replay(state: ReplayState, config: Any, global_steps: int, verl_save: Callable[[], T]) -> T:
    """A trainer's `_save_checkpoint`: the replay state into `global_step_<global_steps>/`, then verl's own save
    (`verl_save()`, returned), then `prune_replay` down to the step folders verl keeps an actor checkpoint in."""
    folder = step_folder(config.trainer.default_local_dir, global_steps)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, BUFFER_NAME)
    state.save(path)
    logger.info("replay buffer (%d rollouts) saved to %s.*", len(state.buffer), path)
    out = verl_save()
    prune_replay(state, config.trainer.default_local_dir, actor_ckpt_to_keep(config))
    return out


def load_replay(state: ReplayState, config: Any, global_steps: int) -> bool:
    """A trainer's `_load_checkpoint`, after verl's: restore the replay state from the folder verl resumed from
    (`resume_folder`). False when it did not resume, or, with `replay.allow_empty_resume=true`, when the folder's
    replay files are missing or of a layout this version cannot read (the state stays empty); otherwise those are
    an error naming the files (FileNotFoundError, ValueError)."""
    folder = resume_folder(config, global_steps)
    if folder is None:
        return False
    path = os.path.join(folder, BUFFER_NAME)
    allow_empty = state.settings.allow_empty_resume
    problem = state.saved_layout_problem(path)
    if problem and not allow_empty:
        raise ValueError(problem)
    if problem:
        logger.warning("%s: resuming with an empty buffer (replay.allow_empty_resume)", problem)
        return False
    if not resume_files_present(folder, state.files(path), allow_empty):
        return False
    state.load(path)
    logger.info("replay buffer (%d rollouts) loaded from %s", len(state.buffer), path)
    return True


def prune_replay(state: ReplayState, default_local_dir: str, keep: Optional[int]) -> None:
    """Drop the replay files from every global_step folder but the newest `keep` (`stale_buffer_folders`): those
    whose actor checkpoint verl prunes, where no resume can start."""
    for folder in stale_buffer_folders(default_local_dir, keep):
        for p in state.files(os.path.join(folder, BUFFER_NAME)):
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)


def actor_ckpt_to_keep(config: Any) -> Optional[int]:
    """How many actor checkpoints verl keeps, read as both its trainers read it: `remove_previous_ckpt_in_save`
    (deprecated) means 1, else `max_actor_ckpt_to_keep` (None: all)."""
    if config.trainer.get("remove_previous_ckpt_in_save", False):
        return 1
    return config.trainer.get("max_actor_ckpt_to_keep", None)


def _abs(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def step_folder(default_local_dir: str, global_steps: int) -> str:
    return os.path.join(_abs(default_local_dir), f"global_step_{global_steps}")


def resume_folder(config: Any, global_steps: int) -> Optional[str]:
    """The checkpoint folder verl's `_load_checkpoint` just resumed from, or None when it started afresh."""
    if config.trainer.resume_mode == "disable" or not global_steps:
        return None
    if config.trainer.resume_mode == "resume_path":
        return _abs(config.trainer.resume_from_path)
    return step_folder(config.trainer.default_local_dir, global_steps)


def stale_buffer_folders(default_local_dir: str, keep: Optional[int]) -> list[str]:
    """The global_step folders holding a buffer, all but the newest `keep` (verl prunes actor/ the same way);
    none when `keep` is unset or not positive."""
    if not keep or keep <= 0:
        return []
    found = []
    for p in glob.glob(os.path.join(_abs(default_local_dir), "global_step_*", BUFFER_NAME + ".json")):
        with contextlib.suppress(ValueError):
            found.append((int(os.path.basename(os.path.dirname(p)).split("global_step_")[-1]), os.path.dirname(p)))
    return [folder for _, folder in sorted(found)[: max(0, len(found) - int(keep))]]


def resume_files_present(folder: str, need: Sequence[str], allow_empty_resume: bool) -> bool:
    """True when every path in `need` exists. Otherwise FileNotFoundError naming the missing ones (a resumed run
    with an empty buffer silently trains without replay for up to `tau_max` steps), or, with
    `replay.allow_empty_resume=true`, False and a warning: the caller starts with an empty buffer."""
    missing = [p for p in need if not os.path.exists(p)]
    if not missing:
        return True
    if not allow_empty_resume:
        raise FileNotFoundError(
            f"resuming from {folder}: replay buffer file(s) {missing} not found. Resume from a checkpoint saved "
            "with grpo-replay, or set replay.allow_empty_resume=true to resume with an empty buffer"
        )
    logger.warning("no replay buffer at %s: resuming with an empty buffer (replay.allow_empty_resume)", missing)
    return False
