"""Which settings name a run: the hash in a comparison's run-directory name (`seed{seed}-{hash}`), taken over the fully
resolved config less the keys that change nothing a run computes, so changing any setting (or a testbed default)
starts fresh runs instead of silently reusing stale ones.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..app import configio
from ..app.run_files import CONFIG
from ..trainer.train_config import resolve

# Keys that change nothing a run computes or writes into its results, only where its files go, where the warm start
# is cached, what is printed while it runs and which trackers get a copy of its rows: excluded from the run-directory
# hash, and from the settings a report says its runs share (a reused run may have had other values). A tracker
# asked for that a started run lacks is refused (`jobs._refuse_missing_trackers`): its logs cannot be added afterwards.
UNHASHED = ("out_dir", "progress", "testbed.cache_dir", "testbed.progress_every", "report_to")
# Keys hashed only away from their default: a run that leaves them alone computes what a run made before they existed
# did (the update and the generation are the same code path), so it keeps that run's hash and directory.
# drift_probe adds the drift/* columns: a run without them lacks what was asked.
_HASHED_WHEN_SET = {"update_epochs": 1, "dynamic_sampling": False, "max_generation_rounds": 10, "drift_probe": 0,
                    "advantage_estimator": "grpo", "reward_funcs": (), "reward_weights": ()}
# Hashed only since then: a finished run under the hash without them is reused when its config holds the values asked.
_HASHED_LATER = ("drift_probe",)


def config_hash(overrides: dict, unhashed: tuple[str, ...] = UNHASHED) -> str:
    """Short hash of the fully resolved TrainConfig (defaults included), minus keys that do not change results."""
    flat = configio.flatten(resolve(overrides).to_dict())
    for k in unhashed:
        flat.pop(k, None)
    for k, default in _HASHED_WHEN_SET.items():
        if flat.get(k) == default:
            flat.pop(k)
    blob = json.dumps(flat, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def run_dir(arm_dir: Path, seed: int, overrides: dict) -> Path:
    """seed{seed}-{hash}; a run made before `_HASHED_LATER` were hashed is found under the older hash and reused
    when its config.yaml holds the values asked for."""
    new = arm_dir / f"seed{seed}-{config_hash(overrides)}"
    old = arm_dir / f"seed{seed}-{config_hash(overrides, UNHASHED + _HASHED_LATER)}"
    if old == new or new.exists() or not (old / CONFIG).is_file():
        return new
    try:
        made = resolve(yaml_path=str(old / CONFIG)).flat()
    except (ValueError, TypeError, RecursionError):  # unreadable: the run is not reused
        return new
    asked = resolve(overrides).flat()
    return old if all(made[k] == asked[k] for k in _HASHED_LATER) else new
