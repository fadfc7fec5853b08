"""Replay with verl's outcome advantage estimators (`algorithm.adv_estimator`), and the refusal of the others.

verl's own implementations (core_algos) against the core's estimators of the same definition; every estimator
verl registers has a decision (integrations/verl/estimators.py); each outcome estimator gives one advantage per
rollout, and through the v1 trainer's real `fit()` (sync mode) a replayed row carries the advantage verl computed
for it when it was fresh, with its |A| priority; the token-level ones are refused by name before anything starts.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("verl.protocol")
ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

from v1_driver import run_fit  # noqa: E402
from v1_setup import RATIO, by_step, empty_tq, replay_cls, tq_cluster, v1_config  # noqa: E402,F401

from grpo_replay import estimate  # noqa: E402
from grpo_replay.integrations.verl.estimators import NOT_IN_V1, OUTCOME, TOKEN_LEVEL, check_estimator  # noqa: E402
from grpo_replay.integrations.verl.legacy.checks import check_config as check_legacy  # noqa: E402
from grpo_replay.adapter_rows import row_advantages  # noqa: E402
from grpo_replay.integrations.verl.v1_checks import check_config  # noqa: E402
from grpo_replay.integrations.verl.v1_store import STORE_TAG, is_store_key  # noqa: E402


def _batch(lengths, seed=0, G=4, n_groups=6):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (n_groups * G,), generator=g).float() / 2  # graded: 0, 0.5, 1
    R = 8
    mask = torch.zeros(len(scores), R)
    lens = lengths(len(scores), g)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    rewards = torch.zeros(len(scores), R)
    rewards[torch.arange(len(scores)), torch.tensor(lens) - 1] = scores  # the outcome reward at the last token
    index = np.array([f"u{i // G}" for i in range(len(scores))], dtype=object)
    return scores, rewards, mask, index, torch.arange(len(scores)) // G


def _equal(n, g):
    return [8] * n


def _varied(n, g):
    return torch.randint(1, 9, (n,), generator=g).tolist()


def _verl(name, rewards, mask, index, **cfg):
    fn = core_algos.get_adv_estimator_fn(name)
    adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=index, config=AlgoConfig(**cfg), **(
        {"norm_adv_by_std_in_grpo": cfg["norm_adv_by_std_in_grpo"]} if "norm_adv_by_std_in_grpo" in cfg else {}))
    return row_advantages(adv, mask)  # one value per rollout, or ValueError


@pytest.mark.parametrize("lengths", [_equal, _varied])
@pytest.mark.parametrize("verl_name,cfg,ours,eps", [
    ("grpo", {}, "grpo", 1e-6), ("grpo_vectorized", {}, "grpo", 1e-6),
    ("grpo", {"norm_adv_by_std_in_grpo": False}, "dr_grpo", 0.0),
    ("rloo", {}, "rloo", 0.0), ("rloo_vectorized", {}, "rloo", 0.0),
])
def test_verl_estimators_equal_the_core_ones(verl_name, cfg, ours, eps, lengths):
    scores, rewards, mask, index, gids = _batch(lengths)
    torch.testing.assert_close(_verl(verl_name, rewards, mask, index, **cfg), estimate(ours, scores, gids, eps)[0],
                               atol=1e-5, rtol=1e-5)


def test_reinforce_plus_plus_baseline_is_the_core_one_up_to_token_weighting():
    """verl whitens over the batch's response tokens, the core over its rollouts: at equal lengths L they differ
    only in the sample std's n - 1 (n rollouts, or n L tokens): verl = core * sqrt((n L - 1) / (L (n - 1)))."""
    scores, rewards, mask, index, gids = _batch(_equal)
    n, L = mask.shape
    bessel = ((n * L - 1) / (L * (n - 1))) ** 0.5
    torch.testing.assert_close(_verl("reinforce_plus_plus_baseline", rewards, mask, index),
                               estimate("reinforce_plus_plus_baseline", scores, gids, 0.0)[0] * bessel,
                               atol=1e-5, rtol=1e-5)
    scores, rewards, mask, index, gids = _batch(_varied)
    assert not torch.allclose(_verl("reinforce_plus_plus_baseline", rewards, mask, index),
                              estimate("reinforce_plus_plus_baseline", scores, gids, 0.0)[0], atol=1e-3)


def test_every_verl_estimator_has_a_decision():
    decided = set(OUTCOME) | set(TOKEN_LEVEL) | set(NOT_IN_V1)
    assert set(core_algos.ADV_ESTIMATOR_REGISTRY) == decided
    assert not (set(OUTCOME) & set(TOKEN_LEVEL))


@pytest.mark.parametrize("name", OUTCOME)
def test_outcome_estimators_give_one_advantage_per_rollout(name):
    _, rewards, mask, index, _ = _batch(_varied, seed=3)
    adv = _verl(name, rewards, mask, index)  # row_advantages refuses a row whose advantages vary over its tokens
    assert adv.shape == (len(rewards),) and bool(torch.isfinite(adv).all())


def _config(name):
    return OmegaConf.create({"algorithm": {"adv_estimator": name}})


@pytest.mark.parametrize("name", TOKEN_LEVEL)
def test_token_level_estimators_are_refused_by_name(name):
    for check in (check_estimator, lambda c: check_estimator(c, v1=False), check_legacy):
        with pytest.raises(ValueError, match=rf"algorithm.adv_estimator='{name}': replay stores one advantage per "
                                             r"rollout.*allowed: an outcome estimator \(grpo, grpo_vectorized, rloo"):
            check(_config(name))


def test_v1_refuses_gdpo_which_it_cannot_run(tmp_path):
    with pytest.raises(ValueError, match=r"algorithm.adv_estimator='gdpo': verl's v1 trainer does not hand gdpo"):
        check_config(v1_config(tmp_path, "sync", "algorithm.adv_estimator=gdpo"))
    check_estimator(_config("gdpo"), v1=False)  # the legacy trainer passes its reward components


@pytest.mark.timeout(900)
def test_v1_fit_replays_each_outcome_estimators_own_advantage(tq_cluster, tmp_path):
    first_fresh = {}
    for name in OUTCOME:
        empty_tq()
        t = run_fit(replay_cls("sync"), v1_config(tmp_path / name, "sync", *RATIO, f"algorithm.adv_estimator={name}",
                                                  "replay.filter_zero_variance=false"))
        steps = by_step(t)
        born = {(u["step"], k): u["rows"][k]["advantages"] for us in steps.values() for u in us for k in u["keys"]}
        replayed = 0
        for us in steps.values():
            for up in us:
                for k, tag in zip(up["keys"], up["tags"]):
                    if is_store_key(k):
                        st = tag[STORE_TAG]
                        assert torch.equal(up["rows"][k]["advantages"], born[(st["step"], st["of"])]), (name, k)
                        replayed += 1
        assert replayed > 0, name
        up = steps[1][0]
        first_fresh[name] = torch.stack([row_advantages(up["rows"][k]["advantages"][None], torch.ones(1, len(
            up["rows"][k]["advantages"])))[0] for k in up["keys"]])
        storage = t.replay_store.buffer.storage
        slots = storage.valid_slots()
        adv = storage.col("advantage")[slots].astype(np.float64)
        cfg = t.replay_store.buffer.config
        np.testing.assert_allclose(storage.col("weight")[slots], np.power(np.abs(adv) + cfg.eps, cfg.alpha), rtol=1e-6)
    # the setting took effect: the same rollouts got each estimator's advantages
    assert torch.equal(first_fresh["grpo_vectorized"], first_fresh["grpo"]) or torch.allclose(
        first_fresh["grpo_vectorized"], first_fresh["grpo"], atol=1e-6)
    for name in ("rloo", "reinforce_plus_plus_baseline", "grpo_passk", "opo", "gpg"):
        assert not torch.allclose(first_fresh[name], first_fresh["grpo"], atol=1e-4), name


@pytest.mark.timeout(600)
@pytest.mark.parametrize("keys,error", [(None, r"GDPO requires 'algorithm.gdpo_reward_keys'"),
                                        ("[acc]", r'key "prompts" not found in TensorDict')])
def test_plain_verl_v1_cannot_run_gdpo(tq_cluster, tmp_path, keys, error):
    """Why gdpo is refused on v1: verl's own v1 trainer, without replay, fails at its first advantage with it
    (its `_compute_advantage` hands gdpo no reward components), with or without `algorithm.gdpo_reward_keys`."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    empty_tq()
    extra = [] if keys is None else [f"+algorithm.gdpo_reward_keys={keys}"]
    with pytest.raises((AssertionError, KeyError), match=error):
        run_fit(TRAINER_REGISTRY["sync"], v1_config(tmp_path, "sync", "algorithm.adv_estimator=gdpo", *extra))
