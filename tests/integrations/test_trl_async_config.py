"""ReplayAsyncGRPOConfig: every key reaches TRL or the replay step, or is refused before anything is loaded."""
from __future__ import annotations

import dataclasses
import math

import pytest

pytest.importorskip("trl")

from async_setup import async_kwargs, make_async_trainer  # noqa: E402

from grpo_replay import ReplayConfig  # noqa: E402
from grpo_replay.errors import ConfigError  # noqa: E402

# One value away from the paper default per core field.
CORE_VALUES = dict(tau_max=3, replay_ratio=0.25, alpha=0.7, eps=1e-3, priority="uniform", composition="pool",
                   granularity="group", warmup_steps=2, capacity=100, replacement=True, max_uses=2, age_decay=5.0,
                   max_drift=0.1)


def _config(tmp_path, **kw):
    from grpo_replay.integrations.trl import ReplayAsyncGRPOConfig

    base = {k: v for k, v in async_kwargs(tmp_path).items() if not k.startswith("replay_")}
    return ReplayAsyncGRPOConfig(**{**base, **kw})


def test_every_field_is_trl_s_or_a_replay_field(tmp_path):
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from grpo_replay.integrations.trl import ReplayAsyncGRPOConfig, ReplayGRPOConfig
    from grpo_replay.integrations.trl.replay_fields import REPLAY_FIELDS

    ours = {f.name for f in dataclasses.fields(ReplayAsyncGRPOConfig)}
    trl_keys = {f.name for f in dataclasses.fields(AsyncGRPOConfig)}
    replay = set(REPLAY_FIELDS.values()) | {"replay_preset", "replay_seed"}
    assert ours == trl_keys | replay and not trl_keys & replay
    assert replay == {f.name for f in dataclasses.fields(ReplayGRPOConfig)} - {f.name for f in dataclasses.fields(
        __import__("trl").GRPOConfig)}  # the same replay keys as the synchronous config
    assert set(CORE_VALUES) | {"fill_filtered"} == set(REPLAY_FIELDS)


@pytest.mark.parametrize("core", sorted(CORE_VALUES))
def test_each_replay_field_reaches_the_replay_config(tmp_path, core):
    from grpo_replay.integrations.trl.replay_fields import REPLAY_FIELDS

    cfg = _config(tmp_path, **{REPLAY_FIELDS[core]: CORE_VALUES[core]}).to_replay_config()
    assert getattr(cfg, core) == CORE_VALUES[core]
    assert cfg == ReplayConfig.paper(**{core: CORE_VALUES[core]})


def test_fill_filtered_and_no_limits_reach_the_replay_config(tmp_path):
    cfg = _config(tmp_path, replay_fill_filtered=True, replay_tau_max=-1, replay_capacity=-1, max_staleness=3)
    assert cfg.to_replay_config() == ReplayConfig.paper(fill_filtered=True, tau_max=None, capacity=None)
    assert cfg.replay_age_bound == 3  # no tau_max: max_staleness bounds the age alone


@pytest.mark.parametrize("kw, field", [
    (dict(replay_max_drift=0.0), "max_drift"),
    (dict(replay_tau_max=0), "replay_tau_max=0 with max_staleness=4"),
    (dict(max_staleness=0), "max_staleness=0"),
    (dict(learning_rate=math.nan), "learning_rate"),
    (dict(epsilon=math.inf), "epsilon"),
    (dict(replay_preset="nope"), "preset"),
])
def test_refused_before_anything_is_loaded(tmp_path, kw, field):
    with pytest.raises(ValueError, match=field):
        _config(tmp_path, **kw)


def test_age_pair_allowed_without_replay(tmp_path):
    assert _config(tmp_path, replay_preset="grpo", max_staleness=0).to_replay_config().enabled is False


def test_trainer_refusals(tmp_path):
    from grpo_replay.integrations.trl import ReplayAsyncGRPOTrainer
    from grpo_replay.integrations.trl.async_local import InProcessRolloutWorker

    class NoLogps(InProcessRolloutWorker):
        provides_behaviour_logps = False

    with pytest.raises(ConfigError, match="returns no behaviour log-probs"):
        make_async_trainer(tmp_path, worker_cls=NoLogps)
    with pytest.raises(ValueError, match="max_drift"):
        ReplayAsyncGRPOTrainer(model=str(tmp_path / "model"), replay_config=ReplayConfig.paper(max_drift=-1.0))


def test_worker_with_zero_log_probs_is_refused_at_its_first_sample(tmp_path):
    from grpo_replay.integrations.trl.async_local import InProcessRolloutWorker

    class ZeroLogps(InProcessRolloutWorker):
        def _logps(self, prompt_ids, completion):
            return [0.0] * len(completion)

    t = make_async_trainer(tmp_path, worker_cls=ZeroLogps, max_steps=1)
    assert t.replay_composer.buffer.config.tau_max == 4 and t.replay_composer.buffer.config.warmup_steps == 0
    with pytest.raises(ValueError, match="old_log_probs are 0 at every loss token"):
        t.train()
