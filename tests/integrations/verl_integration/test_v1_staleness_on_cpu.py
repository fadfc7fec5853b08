"""verl's staleness bound applies to replay rows too, through verl 0.9.1's real v1 `fit()` on CPU.

`trainer.v1.sampler.max_off_policy_threshold` bounds the versions a trajectory spans, from its dispatch to its
update, inclusive; verl's async sampler drops fresh rows past it. A replay row of age a spans a + 1 versions, so
in the async modes replay rows are bounded by min(replay.tau_max, threshold - 1); verl's sync sampler ignores the
threshold (sync is on-policy) and so does replay there. The bound in force is logged at launch.
"""
from __future__ import annotations

import logging

import pytest

pytest.importorskip("verl.protocol")
ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

from v1_driver import run_fit  # noqa: E402
from v1_setup import RATIO, by_step, empty_tq, replay_cls, tq_cluster, v1_config  # noqa: E402,F401

from grpo_replay.integrations.verl.v1_store import STORE_TAG, is_store_key  # noqa: E402

LONG = ("replay.tau_max=4", "replay.filter_zero_variance=false", "trainer.total_training_steps=8")


def replay_ages(trainer) -> list[int]:
    return [step - tag[STORE_TAG]["birth"] for step, us in by_step(trainer).items() for up in us
            for k, tag in zip(up["keys"], up["tags"]) if is_store_key(k)]


def fresh_spans(trainer) -> list[int]:
    """verl's span of every fresh row trained: global step - dispatch step + 1."""
    return [step - tag["global_steps"] + 1 for step, us in by_step(trainer).items() for up in us
            for k, tag in zip(up["keys"], up["tags"]) if not is_store_key(k) and not tag.get("is_padding")]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_v1_replay_rows_respect_max_off_policy_threshold(tq_cluster, tmp_path, mode, caplog):
    empty_tq()
    unbounded = run_fit(replay_cls(mode), v1_config(tmp_path / "a", mode, *RATIO, *LONG,
                                                    "trainer.v1.sampler.max_off_policy_threshold=null"))
    assert max(replay_ages(unbounded)) >= 3  # without the bound, replay reaches past it
    empty_tq()
    with caplog.at_level(logging.INFO, logger="grpo_replay.integrations.verl.trainer_v1"):
        bounded = run_fit(replay_cls(mode), v1_config(tmp_path / "b", mode, *RATIO, *LONG,
                                                      "trainer.v1.sampler.max_off_policy_threshold=3"))
    assert "replay age bound: 2 versions = min(replay.tau_max=4, trainer.v1.sampler.max_off_policy_threshold - 1" \
        in caplog.text
    ages = replay_ages(bounded)
    assert ages and max(ages) <= 2 and min(ages) >= 1
    # every replay row spans no more versions than verl lets a fresh row span
    assert max(a + 1 for a in ages) <= 3 and max(fresh_spans(bounded)) <= 3
    assert bounded.replay_store.session.age_bound == 2 == bounded.replay_store.buffer.config.tau_max  # passed once


@pytest.mark.timeout(900)
def test_v1_sync_mode_keeps_tau_max_as_verl_ignores_the_threshold(tq_cluster, tmp_path):
    empty_tq()
    t = run_fit(replay_cls("sync"), v1_config(tmp_path, "sync", *RATIO, *LONG,
                                              "trainer.v1.sampler.max_off_policy_threshold=2"))
    assert t.replay_store.session.age_bound == 4 and max(replay_ages(t)) >= 3
