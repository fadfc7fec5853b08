"""Log-probs at counted tokens: `ReplayBuffer.add` refuses NaN or inf there, as `load` does, so every buffer that
`save` writes can be loaded; the trainers leave such rows out of the insert (`without_nonfinite_logps`)."""
import math

import pytest
import torch

from grpo_replay import ReplayBuffer, ReplayConfig
from grpo_replay.rollout import nonfinite_logp_rows, without_nonfinite_logps
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


def test_without_nonfinite_logps_leaves_out_the_rows_and_counts_them(tmp_path):
    b = make_batch(2, 4, seed=2, with_ref=True)
    b.behaviour_logps[1, 0] = -math.inf
    b.ref_logps[6, 0] = math.nan
    kept, n = without_nonfinite_logps(b)
    assert n == 2 and len(kept) == 6
    assert nonfinite_logp_rows(b).nonzero().flatten().tolist() == [1, 6]
    buf = ReplayBuffer(ReplayConfig())
    buf.add(kept, step=0)
    buf.save(tmp_path / "buf")
    assert len(ReplayBuffer.load(tmp_path / "buf")) == 6
    same, none = without_nonfinite_logps(kept)
    assert same is kept and none == 0
