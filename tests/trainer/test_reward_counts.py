"""The reward scorer's error and timeout totals survive a resume: the built-in trainer keeps them in its checkpoint's
trainer state (tests/reliability/test_bad_input.py runs that through a crash), the TRL backend in a file per process
inside TRL's checkpoint folder, written by a callback after TRL saves."""
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from grpo_replay.trainer.rewards import RewardScorer
from grpo_replay.trainer.trl.backend import reward_counts_callback


def test_the_trl_callback_saves_the_totals_in_the_checkpoint_and_restores_them(tmp_path):
    scorer = RewardScorer(lambda text, problem: 1.0, timeout=1.0)
    scorer.errors, scorer.timeouts = 3, 1
    (tmp_path / "checkpoint-2").mkdir()
    cb = reward_counts_callback(scorer, rank=1)
    cb.on_save(SimpleNamespace(output_dir=str(tmp_path)), SimpleNamespace(global_step=2), None)
    assert (tmp_path / "checkpoint-2" / "grpo_replay_reward_counts_rank1.json").is_file()
    fresh = RewardScorer(lambda text, problem: 1.0, timeout=1.0)
    reward_counts_callback(fresh, rank=1).restore(str(tmp_path / "checkpoint-2"))
    assert (fresh.errors, fresh.timeouts) == (3, 1)
    other = RewardScorer(lambda text, problem: 1.0, timeout=1.0)
    reward_counts_callback(other, rank=0).restore(str(tmp_path / "checkpoint-2"))  # another process's file: none
    reward_counts_callback(other, rank=0).restore(None)  # a fresh run
    assert (other.errors, other.timeouts) == (0, 0)
