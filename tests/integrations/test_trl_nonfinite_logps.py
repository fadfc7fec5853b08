"""TRL trainers: a fresh row whose behaviour log-probs are NaN or inf at a counted token (a sampler's -inf under
top-p/top-k) is left out of the buffer insert and counted in `buffer/skipped_nonfinite_logps`; every checkpoint's
buffer loads."""
from __future__ import annotations

import math
import os

import pytest

pytest.importorskip("trl")

from test_trl import make_trainer  # noqa: E402

from grpo_replay import ReplayBuffer  # noqa: E402


def test_sync_trainer_leaves_rows_with_nonfinite_logps_out_of_the_buffer(tmp_path):
    from grpo_replay.integrations.trl import ReplayGRPOTrainer

    class OneBadRow(ReplayGRPOTrainer):
        def _replay_flush(self, log, before_step=None):
            for handle in self.replay_session.waiting():
                if len(handle) and not handle.missing.any():
                    handle.rows.behaviour_logps[0, 0] = -math.inf
            super()._replay_flush(log, before_step)

    t = make_trainer(tmp_path, cls=OneBadRow, max_steps=3, save_strategy="steps", save_steps=1)
    t.train()
    skipped = [r["buffer/skipped_nonfinite_logps"] for r in t.state.log_history if "buffer/skipped_nonfinite_logps" in r]
    assert skipped == [1.0, 1.0, 1.0]
    inserted = [h["inserted"] for h in t.replay_history]
    assert t.replay_buffer.total_added == sum(inserted) > 0
    for step in (1, 2, 3):  # every checkpoint's buffer loads
        ReplayBuffer.load(os.path.join(tmp_path, f"checkpoint-{step}", "replay_buffer_rank0"))


def test_async_composer_leaves_rows_with_nonfinite_logps_out_of_the_buffer():
    import numpy as np

    from grpo_replay import ReplayConfig
    from grpo_replay.integrations.trl.async_composer import AsyncComposer

    composer = AsyncComposer(ReplayConfig(), max_staleness=4, chunk_size=4, seed=0, version=lambda: 1)

    def sample(i, logp):
        return {"input_ids": np.array([5, 6, 7, 8]), "completion_mask": np.array([0, 0, 1, 1]),
                "old_log_probs": np.array([0.0, 0.0, logp, -0.5], dtype=np.float32), "advantage": 1.0 - i,
                "group_id": 0, "metrics": {"reward_std": 1.0}, "model_version": 0}

    composer._defer([sample(0, -0.3), sample(1, -math.inf), sample(2, math.nan), sample(3, -0.2)])
    assert composer.session.flush(before=1) == 2
    assert composer.session.take_skipped_nonfinite() == 2 and len(composer.buffer) == 2
    assert composer.buffer.keys()[1].tolist() == [0, 0]
