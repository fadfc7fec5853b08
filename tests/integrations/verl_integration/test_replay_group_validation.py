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


def test_replay_group_takes_the_options_and_only_the_legacy_trainer_refuses_max_drift():
    from grpo_replay.integrations.verl.settings import check_options

    for key, value in (("fill_filtered", True), ("max_uses", 2), ("age_decay", 3.0), ("max_drift", 0.5)):
        assert getattr(split_config({"preset": "paper", key: value})[0], key) == value
    config, settings = split_config({"preset": "paper", "max_drift": 0.5})
    check_options(config, settings)  # the v1 trainer implements it
    with pytest.raises(ValueError, match=r"ReplayConfig\.max_drift=0\.5 is invalid; allowed: None \(the verl legacy integration"):
        check_options(config, settings, legacy=True)
