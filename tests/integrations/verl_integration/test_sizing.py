"""The one mini-batch rule both verl trainers log and apply (sizing.py): total / K rows with
`keep_optimizer_steps`, verl's own mini-batch otherwise, applied to verl's config for one update only."""
from __future__ import annotations

import pytest

pytest.importorskip("verl.protocol")

from omegaconf import OmegaConf  # noqa: E402

from grpo_replay.integrations.verl.sizing import (batch_unit, mini_batch_scaled, scaled_mini_batch,  # noqa: E402
                                                  verl_mini_batch)


def config(**actor):
    return OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 4}, "actor": {
        "ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "use_dynamic_bsz": False, **actor}}})


def test_the_rule_keeps_k_optimizer_steps_or_verls_mini_batch():
    cfg = config()
    mb, n, micro = verl_mini_batch(cfg)
    assert (mb, n, micro) == (16, 4, 2) and verl_mini_batch(config(use_dynamic_bsz=True))[2] == 1
    k, unit = batch_unit(32, mb, 2, micro, n, keep_optimizer_steps=True)
    assert (k, unit) == (2, 8)
    assert scaled_mini_batch(48, k, mb, True) == (24, 2)  # 16 replay rows: the same 2 optimizer steps
    assert scaled_mini_batch(48, k, mb, False) == (16, 3)  # verl's mini-batch: replay adds a step


def test_the_scaled_mini_batch_holds_for_one_update_and_is_restored_also_on_an_error():
    cfg = config()
    with mini_batch_scaled(cfg, 24):
        assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 6  # prompts: rows / rollout.n
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 4
    with pytest.raises(RuntimeError), mini_batch_scaled(cfg, 8):
        raise RuntimeError("the update failed")
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 4
