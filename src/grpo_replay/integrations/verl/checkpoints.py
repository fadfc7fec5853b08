"""Where the replay state sits in verl's checkpoint folders, for both trainers.

verl writes `<trainer.default_local_dir>/global_step_<t>/` (actor/, data.pt, ...) and then
`latest_checkpointed_iteration.txt`; the buffer is saved beside them as `replay_buffer.*`, before verl's own
save, so the iteration file never points at a folder without a buffer.
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
from typing import Any, Optional, Sequence

logger = logging.getLogger(__name__)
BUFFER_NAME = "replay_buffer"


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


def remove_buffer_files(folder: str, suffixes: Sequence[str]) -> None:
    """Delete `<folder>/replay_buffer<suffix>` for each suffix (absent ones are fine)."""
    for suffix in suffixes:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(folder, BUFFER_NAME + suffix))
