"""One save / load / prune of the replay state (checkpoints.py) for both verl trainers: the legacy trainer's
`ReplayHook` and the v1 trainer's `TQReplayStore` (here with its row store in this process) each round-trip through
`save_replay` / `load_replay`, lose their files with the actor checkpoints verl prunes, and only once verl's own
save has completed. CPU only, no Ray."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("verl.protocol")

from omegaconf import OmegaConf  # noqa: E402
from verl_batches import make_batch, v1_row  # noqa: E402

from grpo_replay.config import ReplayConfig  # noqa: E402
from grpo_replay.integrations.verl.checkpoints import BUFFER_NAME, actor_ckpt_to_keep, load_replay, save_replay  # noqa: E402
from grpo_replay.integrations.verl.legacy.hook import ReplayHook  # noqa: E402
from grpo_replay.integrations.verl.settings import VerlReplaySettings  # noqa: E402
from grpo_replay.integrations.verl.v1_store import FreshRows, TQReplayStore  # noqa: E402


def trainer_config(root, resume_mode="disable", **trainer):
    return OmegaConf.create({"trainer": {"default_local_dir": str(root), "resume_mode": resume_mode,
                                         "resume_from_path": None, "max_actor_ckpt_to_keep": None, **trainer}})


def legacy_state(step: int, into: ReplayHook | None = None, **settings) -> ReplayHook:
    hook = into or ReplayHook(ReplayConfig.paper(warmup_steps=0), VerlReplaySettings(**settings))
    hook(make_batch(step), step)
    return hook


def v1_state(step: int, into: TQReplayStore | None = None, **settings) -> TQReplayStore:
    store = into or TQReplayStore(ReplayConfig.paper(warmup_steps=0), VerlReplaySettings(**settings))
    n = 8
    fresh = FreshRows(keys=[f"u{step}{i // 4}_{i % 4}_0" for i in range(n)], tags=[{}] * n,
                      rewards=torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0]), advantages=torch.randn(n),
                      group_ids=torch.arange(n) // 4, prompt_keys=np.arange(n, dtype=np.int64),
                      birth=np.full(n, step, dtype=np.int64))
    ids = store.defer(fresh, np.arange(n)).seqs  # the row store's ids: the rows' insertion numbers
    store.rows.put(ids.tolist(), [v1_row(3, 4, seed=int(i)) for i in ids], [{"seq_len": 7}] * n)
    store.flush()
    return store


STATES = {"legacy": legacy_state, "v1": v1_state}
FILES = {"legacy": [".json", ".npz"], "v1": [".json", ".npz", ".store.json", ".rows.pt"]}


class VerlSave:
    """Stands in for verl's `_save_checkpoint`: records the replay files present when it runs, writes the
    iteration file last, and fails when told to."""

    def __init__(self, root, step, fail=False):
        self.root, self.step, self.fail, self.seen = root, step, fail, None

    def __call__(self):
        self.seen = sorted(os.listdir(self.root / f"global_step_{self.step}"))
        if self.fail:
            raise RuntimeError("verl's save failed")
        (self.root / "latest_checkpointed_iteration.txt").write_text(str(self.step))
        return "verl's result"


def replay_files(root, step):
    folder = root / f"global_step_{step}"
    return sorted(p for p in os.listdir(folder) if p.startswith(BUFFER_NAME)) if folder.exists() else []


@pytest.mark.parametrize("trainer", ["legacy", "v1"])
def test_both_trainers_states_round_trip_and_are_pruned_as_verl_prunes_the_actor(tmp_path, trainer):
    make, root = STATES[trainer], tmp_path / "ckpt"
    cfg = trainer_config(root, max_actor_ckpt_to_keep=2)
    state = None
    for step in (1, 2, 3):
        state = make(step, state)
        save = VerlSave(root, step)
        assert save_replay(state, cfg, step, save) == "verl's result"
        assert save.seen == sorted(BUFFER_NAME + s for s in FILES[trainer])  # written before verl's save
    assert replay_files(root, 1) == [] and len(replay_files(root, 3)) == len(FILES[trainer])

    again = make(1)  # something else in it: the load replaces it
    assert load_replay(again, trainer_config(root, "auto"), 3)
    assert len(again.buffer) == len(state.buffer) > 0
    a, b = state.buffer.state_dict(), again.buffer.state_dict()
    assert a["rng"] == b["rng"] and a["totals"] == b["totals"]
    if trainer == "v1":
        assert again.rows.ids().tolist() == sorted(state.live_ids().tolist()) and again.buffer.next_seq == state.buffer.next_seq
    assert not load_replay(make(1), trainer_config(root, "disable"), 3)  # no resume: nothing loaded


@pytest.mark.parametrize("trainer", ["legacy", "v1"])
def test_deprecated_remove_previous_ckpt_in_save_keeps_one_for_both_trainers(tmp_path, trainer):
    make, root = STATES[trainer], tmp_path / "ckpt"
    cfg = trainer_config(root, max_actor_ckpt_to_keep=3, remove_previous_ckpt_in_save=True)
    assert actor_ckpt_to_keep(cfg) == 1  # as verl reads it in both its trainers
    state = None
    for step in (1, 2):
        state = make(step, state)
        save_replay(state, cfg, step, VerlSave(root, step))
    assert replay_files(root, 1) == [] and replay_files(root, 2)


@pytest.mark.parametrize("trainer", ["legacy", "v1"])
def test_a_failed_verl_save_prunes_nothing(tmp_path, trainer):
    make, root = STATES[trainer], tmp_path / "ckpt"
    cfg = trainer_config(root, max_actor_ckpt_to_keep=1)
    state = make(1)
    save_replay(state, cfg, 1, VerlSave(root, 1))
    with pytest.raises(RuntimeError, match="verl's save failed"):
        save_replay(make(2, state), cfg, 2, VerlSave(root, 2, fail=True))
    assert len(replay_files(root, 1)) == len(FILES[trainer])  # step 1 is still the checkpoint to resume


@pytest.mark.parametrize("trainer", ["legacy", "v1"])
def test_missing_files_are_named_unless_an_empty_resume_is_allowed(tmp_path, trainer):
    make, root = STATES[trainer], tmp_path / "ckpt"
    save_replay(make(1), trainer_config(root), 1, VerlSave(root, 1))
    os.remove(root / "global_step_1" / f"{BUFFER_NAME}.npz")
    with pytest.raises(FileNotFoundError, match=r"replay_buffer\.npz.*allow_empty_resume"):
        load_replay(make(1), trainer_config(root, "auto"), 1)
    empty = STATES[trainer](1, allow_empty_resume=True)
    n = len(empty.buffer)
    assert not load_replay(empty, trainer_config(root, "auto"), 1) and len(empty.buffer) == n  # left as it was
