"""Log-probs at counted tokens: `ReplayBuffer.add` refuses NaN or inf there, as `load` does, so every buffer that
`save` writes can be loaded; every trainer's insert (`ReplaySession.flush`) leaves such rows out and counts them."""
import math

import pytest
import torch

from grpo_replay import ReplayBuffer, ReplayConfig
from grpo_replay.rollout import nonfinite_logp_rows
from grpo_replay.session import ReplaySession
from helpers import make_batch


@pytest.mark.parametrize("field", ["behaviour_logps", "ref_logps"])
@pytest.mark.parametrize("value", [-math.inf, math.inf, math.nan])
def test_add_refuses_nonfinite_logps_at_a_counted_token_and_changes_nothing(tmp_path, field, value):
    buf = ReplayBuffer(ReplayConfig())
    buf.add(make_batch(2, 4, seed=1, with_ref=True), step=0)
    before = buf.state_dict()
    b = make_batch(2, 4, seed=2, with_ref=True)
    getattr(b, field)[3, 0] = value  # position 0 of every row is a counted token
    with pytest.raises(ValueError, match=rf"{field} must be finite at counted tokens.*rows \[3\]"):
        buf.add(b, step=1)
    assert len(buf) == 8 and buf.state_dict()["totals"] == before["totals"]
    buf.save(tmp_path / "buf")
    assert len(ReplayBuffer.load(tmp_path / "buf")) == 8


def test_nonfinite_logps_in_padding_are_stored_and_reload():
    b = make_batch(2, 4, seed=2)
    pad = (b.completion_mask == 0).nonzero()[0]  # a padding position
    b.behaviour_logps[pad[0], pad[1]] = -math.inf
    buf = ReplayBuffer(ReplayConfig())
    assert buf.add(b, step=0) == 8 and not nonfinite_logp_rows(b).any()


def test_add_refuses_nonfinite_rewards_as_load_does():
    b = make_batch(2, 4, seed=2)
    b.rewards[5] = math.nan
    with pytest.raises(ValueError, match=r"rewards must be finite; rows \[5\]"):
        ReplayBuffer(ReplayConfig()).add(b, step=0)


def test_the_session_leaves_rows_with_nonfinite_logps_out_of_the_insert_and_counts_them(tmp_path):
    b = make_batch(2, 4, seed=2, with_ref=True)
    b.behaviour_logps[1, 0] = -math.inf
    b.ref_logps[6, 0] = math.nan
    assert nonfinite_logp_rows(b).nonzero().flatten().tolist() == [1, 6]
    session = ReplaySession(ReplayConfig())
    session.defer(b)
    assert session.flush() == 6 and len(session.buffer) == 6
    assert session.take_skipped_nonfinite() == 2 and session.take_skipped_nonfinite() == 0
    session.save(tmp_path / "buf")
    assert len(ReplayBuffer.load(tmp_path / "buf")) == 6
    bad = make_batch(1, 2, seed=3, with_ref=True)
    bad.behaviour_logps[:, 0] = math.nan  # every row: nothing to insert, nothing refused
    session.defer(bad)
    assert session.flush() == 0 and len(session.buffer) == 6 and session.take_skipped_nonfinite() == 2
