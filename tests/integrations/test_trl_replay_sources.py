"""The replay settings of ReplayGRPOTrainer / ReplayAsyncGRPOTrainer come from one place: the `replay_*` fields of
`args`, or `replay_config`; both given, they must agree, else a ConfigError naming the fields before anything loads."""
from __future__ import annotations

import pytest

pytest.importorskip("trl")

from async_setup import async_kwargs, make_async_trainer  # noqa: E402
from test_trl import make_dataset, make_model, make_tokenizer, reward_fn, trl_kwargs  # noqa: E402

from grpo_replay import ReplayConfig  # noqa: E402
from grpo_replay.errors import ConfigError  # noqa: E402


def _sync(tmp_path, model, args, **kw):
    from grpo_replay.integrations.trl import ReplayGRPOTrainer

    return ReplayGRPOTrainer(model=model, reward_funcs=reward_fn, args=args, train_dataset=make_dataset(),
                             processing_class=make_tokenizer(), **kw)


def _sync_args(tmp_path, **kw):
    from grpo_replay.integrations.trl import ReplayGRPOConfig

    return ReplayGRPOConfig(**trl_kwargs(tmp_path, **kw))


def _async_args(tmp_path, **kw):
    from grpo_replay.integrations.trl import ReplayAsyncGRPOConfig

    return ReplayAsyncGRPOConfig(**async_kwargs(tmp_path, **kw))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_differing_sources_are_refused_before_loading(tmp_path, kind):
    from grpo_replay.integrations.trl import ReplayAsyncGRPOTrainer, ReplayGRPOTrainer

    make_args = _sync_args if kind == "sync" else _async_args
    cls = ReplayGRPOTrainer if kind == "sync" else ReplayAsyncGRPOTrainer
    args = make_args(tmp_path, replay_ratio=0.25, replay_tau_max=3)
    other = ReplayConfig.paper(warmup_steps=1)  # the args' warm-up (trl_kwargs / async_kwargs set 1), nothing else
    missing = str(tmp_path / "no-such-model")  # loading it would fail with another error: the check comes first
    with pytest.raises(ConfigError) as err:
        cls(model=missing, args=args, replay_config=other)
    msg = str(err.value)
    assert cls.__name__ in msg and "replay_config" in msg and "args" in msg
    assert "replay_ratio: args gives 0.25, replay_config gives 0.5" in msg
    assert "replay_tau_max: args gives 3, replay_config gives 10" in msg
    assert "replay_alpha" not in msg  # only the fields that differ are named


def test_sync_equal_sources_or_one_source_are_used(tmp_path):
    args = _sync_args(tmp_path, replay_ratio=0.25, replay_tau_max=3)
    same = args.to_replay_config()
    assert _sync(tmp_path, make_model(), args, replay_config=same).replay_config == same
    assert _sync(tmp_path, make_model(), args).replay_config == same  # from args alone
    import trl

    # two groups of 4 a step: replay_ratio 1 gives pool one whole replayed group (with one group none would fit,
    # and the trainer refuses an arm that would replay nothing)
    kw = trl_kwargs(tmp_path, per_device_train_batch_size=8)
    plain = trl.GRPOConfig(**{k: v for k, v in kw.items() if not k.startswith("replay_")})
    given = ReplayConfig.uniform_pool(warmup_steps=2, replay_ratio=1.0)
    assert _sync(tmp_path, make_model(), plain, replay_config=given).replay_config == given


def test_async_equal_sources_are_used(tmp_path):
    t = make_async_trainer(tmp_path, replay_ratio=0.25, replay_tau_max=3)
    same = t.args.to_replay_config()
    assert t.replay_config == same and same.replay_ratio == 0.25 and same.tau_max == 3
    from grpo_replay.integrations.trl import ReplayAsyncGRPOTrainer

    again = ReplayAsyncGRPOTrainer(model=str(tmp_path / "model"), args=t.args, replay_config=same,
                                   reward_funcs=reward_fn, train_dataset=make_dataset(),
                                   processing_class=make_tokenizer(), rollout_worker=t.rollout_worker,
                                   weight_transfer=t.weight_transfer)
    assert again.replay_config == same and again.replay_composer.buffer.config.replay_ratio == 0.25
