"""The verl `replay` group builds its ReplayConfig through the core constructor: NaN/inf are rejected there."""
from __future__ import annotations

import math

import pytest

pytest.importorskip("verl.protocol")

from grpo_replay.integrations.verl import split_config  # noqa: E402


@pytest.mark.parametrize("key,value", [("replay_ratio", math.inf), ("alpha", math.nan), ("eps", -math.inf)])
def test_replay_group_rejects_non_finite_floats(key, value):
    with pytest.raises(ValueError, match=rf"ReplayConfig\.{key}=.* is invalid; allowed: a finite number"):
        split_config({"preset": "paper", key: value})


@pytest.mark.parametrize("key,value", [("max_drift", 0.5), ("fill_filtered", True), ("max_uses", 2), ("age_decay", 3.0)])
def test_replay_group_refuses_the_options_it_does_not_implement(key, value):
    with pytest.raises(ValueError, match=rf"ReplayConfig\.{key}=.* is invalid; allowed: .*the verl integration does not implement"):
        split_config({"preset": "paper", key: value})
    assert split_config({"preset": "paper", key: None if value is not True else False})[0] == split_config({})[0]
