"""The verl replay hook on synthetic DataProto batches shaped like verl 0.9.1's (see conftest.py). CPU only."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("verl.protocol")  # a real module: a folder named verl on sys.path must not count

from verl_batches import make_batch  # noqa: E402

from grpo_replay.config import ReplayConfig  # noqa: E402
from grpo_replay.integrations.verl import (  # noqa: E402
    ReplayHook,
    VerlReplaySettings,
    prompt_key,
    split_config,
    to_dataproto,
    to_rollout_batch,
)


def hook(**kw) -> ReplayHook:
    settings = {k: kw.pop(k) for k in list(kw) if k in VerlReplaySettings.__dataclass_fields__}
    return ReplayHook(ReplayConfig(**{"warmup_steps": 0, **kw}), VerlReplaySettings(**settings))


def row_sig(td, i) -> tuple:
    """Identity of a rollout independent of padding: real prompt tokens + real response tokens."""
    p = td["prompts"][i][td["attention_mask"][i, : td["prompts"].shape[1]].bool()].tolist()
    c = int(td["response_mask"][i].sum())
    return tuple(p), tuple(td["responses"][i, :c].tolist())


def test_roundtrip_rebuilds_verl_layout():
    b = make_batch(3, with_ref=True)
    rb, keys = to_rollout_batch(b, step=3)
    out, kept = to_dataproto(rb, b)
    assert len(kept) == len(b)
    for k in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(out.batch[k], b.batch[k]), k
    m = b.batch["response_mask"].bool()
    for k in ("old_log_probs", "advantages", "ref_log_prob"):
        assert torch.equal(out.batch[k][m], b.batch[k][m]), k
        assert out.batch[k].dtype == b.batch[k].dtype
    assert torch.allclose(out.batch["token_level_rewards"].sum(-1), b.batch["token_level_rewards"].sum(-1))
    # prompt identity: a hash of the unpadded prompt ids, equal for all rows of a group
    assert len(set(keys.tolist())) == len(set(b.non_tensor_batch["uid"]))


def test_prompt_key_is_stable_across_steps_and_uids():
    a = make_batch(1, prompt_ids=[5, 6], n_prompts=2)
    b = make_batch(9, prompt_ids=[5, 6], n_prompts=2, P=12)  # new uuids, wider padding
    assert not set(a.non_tensor_batch["uid"]) & set(b.non_tensor_batch["uid"])
    _, ka = to_rollout_batch(a, 1)
    _, kb = to_rollout_batch(b, 9)
    assert np.array_equal(ka, kb)
    assert prompt_key(np.array([1, 2, 3])) == prompt_key(np.array([1, 2, 3], dtype=np.int32))
    assert prompt_key(np.array([1, 2, 3])) != prompt_key(np.array([3, 2, 1]))


def test_shapes_keys_and_meta_after_hook():
    h = hook()
    h(make_batch(1), 1, dp_size=2, mini_batch_rows=32, group_size=4)
    fresh = make_batch(2)
    meta_before = dict(fresh.meta_info)
    out = h(fresh, 2, dp_size=2, mini_batch_rows=32, group_size=4)
    plan = h.last_plan
    assert plan.n_replay > 0
    assert set(out.batch.keys()) == set(fresh.batch.keys())
    assert set(out.non_tensor_batch) == set(fresh.non_tensor_batch)
    for k in fresh.batch.keys():
        assert out.batch[k].shape[1:] == fresh.batch[k].shape[1:], k
        assert out.batch[k].dtype == fresh.batch[k].dtype, k
    assert len(out) == plan.n_total == plan.n_fresh_used + plan.n_replay
    assert out.meta_info["global_token_num"] == out.batch["attention_mask"].sum(-1).tolist()
    assert fresh.meta_info == meta_before  # the caller's batch is not mutated
    rep = out.non_tensor_batch["uid"][plan.n_fresh_used :]
    assert all(str(u).startswith("replay-") for u in rep)
    # position ids follow verl's compute_position_id_with_mask; input_ids = prompts ++ responses
    att = out.batch["attention_mask"]
    assert torch.equal(out.batch["position_ids"], torch.clip(torch.cumsum(att, -1) - 1, min=0))
    assert torch.equal(out.batch["input_ids"], torch.cat([out.batch["prompts"], out.batch["responses"]], 1))
    # verl's actor input path accepts the composed batch
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(out.to_tensordict())
    assert td["input_ids"].is_nested and td.batch_size[0] == len(out)


def test_replay_rows_keep_stored_advantages_and_old_log_probs():
    h = hook(tau_max=10, replay_ratio=1.0)
    stored = {}
    for t in range(1, 5):
        b = make_batch(t, with_ref=True)
        out = h(b, t, mini_batch_rows=len(b), group_size=4)
        plan = h.last_plan
        td = out.batch
        for i in range(plan.n_fresh_used, len(out)):
            sig = row_sig(td, i)
            assert sig in stored, "a replay row must be a rollout inserted at an earlier step"
            adv, old, ref, birth = stored[sig]
            m = td["response_mask"][i].bool()
            assert torch.equal(td["advantages"][i][m], adv)
            assert torch.equal(td["old_log_probs"][i][m], old)  # no recompute: the birth-step values
            assert torch.equal(td["ref_log_prob"][i][m], ref)
            assert birth < t
        ftd = b.batch
        for i in range(len(b)):
            m = ftd["response_mask"][i].bool()
            values = (ftd["advantages"][i][m], ftd["old_log_probs"][i][m], ftd["ref_log_prob"][i][m], t)
            stored.setdefault(row_sig(ftd, i), values)
    assert h.buffer.total_added > 0


@pytest.mark.parametrize("dp_size", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("keep_steps", [True, False])
def test_total_divisible_and_optimizer_steps_unchanged(dp_size, n, keep_steps):
    n_prompts = 8
    N = n_prompts * n
    mb = N // 2  # two optimizer steps per epoch without replay (ppo_mini_batch_size = 4 prompts)
    if mb % dp_size:
        pytest.skip("verl itself requires the mini-batch to divide by dp")
    h = hook(tau_max=3, replay_ratio=0.5, keep_optimizer_steps=keep_steps)
    for t in range(1, 9):
        g = np.random.default_rng(t + 100 * n + dp_size)
        rewards = (g.random(N) < [0.0, 0.3, 1.0][t % 3]).astype(np.float32)  # some steps all zero-variance
        b = make_batch(t, n_prompts=n_prompts, n=n, rewards=rewards)
        out = h(b, t, dp_size=dp_size, mini_batch_rows=mb, group_size=n)
        p = h.last_plan
        assert len(out) == p.n_total > 0
        assert p.n_total % dp_size == 0
        assert p.mini_batch_rows * p.n_mini_batches == p.n_total
        assert p.mini_batch_rows % dp_size == 0
        if keep_steps:
            assert p.n_mini_batches == N // mb  # no extra optimizer step
            assert p.mini_batch_rows % n == 0  # expressible as ppo_mini_batch_size * rollout.n
            assert p.n_total % (2 * math.lcm(n, dp_size)) == 0
        else:
            assert p.mini_batch_rows == mb


def test_age_eviction_by_global_step_and_tau_max_bound():
    tau = 2
    h = hook(tau_max=tau, replay_ratio=1.0)
    seen_ages = set()
    for t in range(1, 12):
        h(make_batch(t), t, mini_batch_rows=32, group_size=4)
        p = h.last_plan
        assert p.metrics["replay/age_max"] <= tau if p.n_replay else "replay/age_max" not in p.metrics
        births = h.buffer.storage.col("birth_step")[h.buffer.storage.valid_slots()]
        # after this step's draw every stored rollout is at most tau steps old (this step's rows are age 0)
        assert (t - births).max() <= tau
        assert (births >= t - tau).all()
        if p.n_replay:
            seen_ages.add(int(p.metrics["replay/age_max"]))
    assert tau in seen_ages  # replay does reach back tau steps, and never further
    assert h.buffer.total_evicted_age > 0


def test_tau_zero_means_no_replay_from_earlier_steps():
    h = hook(tau_max=0)
    for t in range(1, 4):
        h(make_batch(t), t)
        assert h.last_plan.n_replay == 0


def test_zero_variance_groups_are_filtered_and_never_inserted():
    n_prompts, n = 4, 4
    rewards = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0], dtype=np.float32)
    h = hook(replay_ratio=0.0)
    b = make_batch(1, n_prompts=n_prompts, n=n, rewards=rewards)
    out = h(b, 1, mini_batch_rows=8, group_size=4)
    assert h.last_plan.n_zero_variance == 8
    assert h.last_plan.n_inserted == 8 and len(h.buffer) == 8
    uids = b.non_tensor_batch["uid"]
    assert set(out.non_tensor_batch["uid"]) == {uids[8], uids[12]}
    # all groups zero-variance: the whole fresh batch is used (all A = 0), nothing is inserted
    h2 = hook()
    out2 = h2(make_batch(1, n_prompts=2, n=4, rewards=np.ones(8, np.float32)), 1, mini_batch_rows=8, group_size=4)
    assert len(out2) == 8 and len(h2.buffer) == 0
    # filter off: zero-variance rows stay in the update but are still not inserted
    h3 = hook(filter_zero_variance=False)
    out3 = h3(b, 1, mini_batch_rows=8, group_size=4)
    assert len(out3) == 16 and len(h3.buffer) == 8


def test_fresh_rows_are_all_kept_when_replay_is_plentiful():
    h = hook(replay_ratio=1.0, tau_max=None)
    rewards = np.tile(np.array([1, 0, 0, 0], np.float32), 8)  # every group has variance
    for t in range(1, 4):
        b = make_batch(t, rewards=rewards)
        out = h(b, t, dp_size=4, mini_batch_rows=32, group_size=4)
        fresh_uids = list(b.non_tensor_batch["uid"])
        assert list(out.non_tensor_batch["uid"][: len(b)]) == fresh_uids  # fresh anchor: the whole batch
        assert h.last_plan.n_fresh_used == len(b)
    assert h.last_plan.n_replay == 32


def test_warmup_and_presets():
    h = ReplayHook(ReplayConfig(warmup_steps=3))
    for t in range(1, 5):
        h(make_batch(t), t)
        assert (h.last_plan.n_replay > 0) == (t >= 3)
    g = ReplayHook(ReplayConfig.grpo(warmup_steps=0))
    for t in range(1, 4):
        g(make_batch(t), t)
        assert g.last_plan.n_replay == 0
    pool = ReplayHook(ReplayConfig.uniform_pool(warmup_steps=0))
    rewards = np.tile(np.array([1, 0, 0, 0], np.float32), 8)
    for t in range(1, 4):
        out = pool(make_batch(t, rewards=rewards), t, mini_batch_rows=32, group_size=4)
        assert len(out) == 32  # pool: replay displaces fresh rows, the total stays the fresh count
    assert pool.last_plan.n_replay > 0


def test_replay_rows_wider_than_the_run_are_dropped():
    h = hook(replay_ratio=1.0)
    h(make_batch(1, P=8), 1)
    out = h(make_batch(2, P=3), 2)  # pool prompts have 2..6 tokens: most stored prompts no longer fit
    assert out.batch["prompts"].shape[1] == 3
    assert h.last_plan.metrics["replay/dropped_too_wide"] > 0


def test_unsupported_batches_fail_clearly():
    b = make_batch(1)
    b.batch["advantages"] = b.batch["advantages"] + torch.linspace(0, 1, b.batch["advantages"].shape[1])
    with pytest.raises(ValueError, match="outcome estimators"):
        hook()(b, 1)
    b = make_batch(1)
    b.batch["routed_experts"] = torch.zeros(len(b), 14, dtype=torch.long)
    with pytest.raises(ValueError, match="routed_experts"):
        hook()(b, 1)
    b = make_batch(1)
    del b.batch["old_log_probs"]
    with pytest.raises(KeyError, match="old log-probs"):
        hook()(b, 1)


def test_unknown_tensor_keys_are_zero_filled_with_a_warning():
    h = hook()
    h(make_batch(1), 1)
    b = make_batch(2)
    b.batch["my_extra"] = torch.ones(len(b), 6)
    with pytest.warns(UserWarning, match="my_extra"):
        out = h(b, 2)
    assert torch.equal(out.batch["my_extra"][h.last_plan.n_fresh_used :], torch.zeros(h.last_plan.n_replay, 6))


def test_buffer_state_roundtrip_continues_identically(tmp_path):
    a = hook(tau_max=4)
    for t in range(1, 5):
        a(make_batch(t), t)
    a.save(tmp_path / "replay_buffer")
    b = hook(tau_max=4)
    b.load(tmp_path / "replay_buffer")
    assert len(b.buffer) == len(a.buffer)
    oa = a(make_batch(5), 5)
    ob = b(make_batch(5), 5)
    assert torch.equal(oa.batch["input_ids"], ob.batch["input_ids"])  # same rng state, same draw


def test_split_config_matches_core_presets_and_rejects_typos():
    for name in ("paper", "grpo", "uniform_pool", "sigma_pool"):
        cfg, settings = split_config({"preset": name})
        assert cfg == ReplayConfig.from_preset(name)
        assert settings == VerlReplaySettings()
    cfg, s = split_config({"preset": "paper", "tau_max": 5, "seed": 3})
    assert cfg.tau_max == 5 and s.seed == 3
    with pytest.raises(ValueError, match="tau_maxx"):
        split_config({"tau_maxx": 5})
    with pytest.raises(ValueError):
        split_config({"priority": "nope"})


def test_kl_in_reward_decides_zero_variance_and_stored_reward_on_task_score():
    """algorithm.use_kl_in_reward: token_level_rewards = scores - beta * KL; groups tie on the task score only."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    n_prompts, n = 4, 4
    rewards = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0], dtype=np.float32)
    b = make_batch(1, n_prompts=n_prompts, n=n, rewards=rewards)
    m = b.batch["response_mask"].float()
    kl = 0.01 * torch.rand(m.shape, generator=torch.Generator().manual_seed(0)) * m
    b.batch["token_level_rewards"] = b.batch["token_level_scores"] - kl  # verl's apply_kl_penalty
    b.batch["rm_scores"] = b.batch["token_level_rewards"].clone()  # a KL-free key must win, whatever the others
    adv, ret = compute_grpo_outcome_advantage(b.batch["token_level_rewards"], m, index=b.non_tensor_batch["uid"])
    b.batch["advantages"], b.batch["returns"] = adv, ret
    h = hook(replay_ratio=0.0)
    out = h(b, 1, mini_batch_rows=8, group_size=4)
    assert h.last_plan.n_zero_variance == 8
    assert h.last_plan.n_inserted == 8 and len(out) == 8
    stored = np.sort(h.buffer.storage.col("reward")[h.buffer.storage.valid_slots()])
    assert np.array_equal(stored, np.sort(rewards[8:]))  # the task score, not score - beta * KL


@pytest.mark.parametrize("dp_size", [2, 8])
@pytest.mark.parametrize("n", [2, 8])
@pytest.mark.parametrize("micro", [1, 2, 4])
@pytest.mark.parametrize("keep_steps", [True, False])
def test_static_micro_batches_divide_each_rank_share(dp_size, n, micro, keep_steps):
    """verl's prepare_micro_batches: a rank's share of a mini-batch must divide by ppo_micro_batch_size_per_gpu."""
    n_prompts = 16
    N, mb = n_prompts * n, n_prompts * n // 2
    h = hook(tau_max=3, replay_ratio=0.5, keep_optimizer_steps=keep_steps)
    if mb % (dp_size * micro):  # verl's own config is invalid: its worker would assert without replay too
        with pytest.raises(ValueError, match="ppo_micro_batch_size_per_gpu"):
            h(make_batch(1, n_prompts=n_prompts, n=n), 1, dp_size=dp_size, mini_batch_rows=mb, group_size=n,
              micro_batch_size_per_gpu=micro)
        return
    for t in range(1, 6):
        g = np.random.default_rng(t + 10 * n + dp_size)
        rewards = (g.random(N) < [0.0, 0.3, 0.8][t % 3]).astype(np.float32)
        out = h(make_batch(t, n_prompts=n_prompts, n=n, rewards=rewards), t, dp_size=dp_size, mini_batch_rows=mb,
                group_size=n, micro_batch_size_per_gpu=micro)
        p = h.last_plan
        assert len(out) == p.n_total == p.mini_batch_rows * p.n_mini_batches
        assert (p.mini_batch_rows // dp_size) % micro == 0 and p.mini_batch_rows % dp_size == 0
        if keep_steps:
            assert p.n_mini_batches == 2 and p.mini_batch_rows % n == 0


def test_issue_example_dp8_n8_micro4_is_divisible():
    """dp=8, n=8, 16 prompts, micro 4: the old rounding gave 176 rows (22 per GPU, not a multiple of 4)."""
    h = hook(replay_ratio=0.5)
    rewards = np.tile(np.array([1, 0, 0, 0, 0, 0, 0, 0], np.float32), 16)
    for t in (1, 2):
        out = h(make_batch(t, n_prompts=16, n=8, rewards=rewards), t, dp_size=8, mini_batch_rows=128, group_size=8,
                micro_batch_size_per_gpu=4)
    assert h.last_plan.n_replay > 0
    assert (len(out) // 8) % 4 == 0


def test_split_uid_runs():
    from grpo_replay.integrations.verl.legacy.uids import adjacent_uid_order, split_uid_runs

    u = np.array(["a", "a", "a", "b", "b", "r1", "r1", "r1"], dtype=object)
    out = split_uid_runs(u, 4, n_first=5)
    assert len(set(out)) == 4 and list(out[:5]) == list(u[:5])  # the replay run is split first
    assert list(out[5:7]) == ["r1", "r1"]
    out = split_uid_runs(u, 8, n_first=5)
    assert len(set(out)) == 8
    assert split_uid_runs(u, 3).tolist() == u.tolist()
    with pytest.raises(ValueError, match="adjacent"):
        split_uid_runs(np.array(["a", "b", "a", "b"], dtype=object), 4)
    order = adjacent_uid_order(np.array(["b", "a", "b", "c", "a"], dtype=object))
    assert order.tolist() == [0, 2, 1, 4, 3]


@pytest.mark.parametrize("dp_size", [2, 4, 8])
def test_prefix_grouper_uid_count_divides_dp(dp_size):
    """verl's _balance_batch with use_prefix_grouper needs #distinct uids % dp == 0, each uid's rows adjacent."""
    from verl.utils.seqlen_balancing import get_group_balanced_partitions

    h = hook(tau_max=3, replay_ratio=0.5)
    n_prompts, n = 8, 4
    for t in range(1, 8):
        g = np.random.default_rng(t + dp_size)
        b = make_batch(t, n_prompts=n_prompts, n=n, rewards=(g.random(32) < 0.4).astype(np.float32))
        uids_before = b.non_tensor_batch["uid"].copy()
        out = h(b, t, dp_size=dp_size, mini_batch_rows=16, group_size=n, prefix_grouper=True)
        uid = out.non_tensor_batch["uid"]
        assert len(set(uid)) % dp_size == 0, (t, len(set(uid)))
        runs = 1 + int((uid[1:] != uid[:-1]).sum())
        assert runs == len(set(uid))  # adjacent
        assert np.array_equal(b.non_tensor_batch["uid"], uids_before)  # the caller's batch is not relabelled
        seqlen = out.batch["attention_mask"].sum(-1).tolist()
        parts = get_group_balanced_partitions(seqlen_list=seqlen, uid_list=list(uid), k_partitions=dp_size)
        assert sorted(i for p in parts for i in p) == list(range(len(out)))
        # every row of one prompt stays under uids of that prompt (a split only peels rows off a group)
        sig = [tuple(out.batch["prompts"][i].tolist()) for i in range(len(out))]
        for u in set(uid):
            assert len({sig[i] for i in np.flatnonzero(uid == u)}) == 1


# --- options beyond the paper ---------------------------------------------------------------------------
def test_fill_filtered_fills_the_update_to_the_generated_rows():
    h = hook(fill_filtered=True, tau_max=None)
    rewards = np.tile(np.array([1, 0, 0, 0], np.float32), 8)  # every group has variance: nothing filtered
    h(make_batch(1, rewards=rewards), 1, mini_batch_rows=32, group_size=4)
    assert h.last_plan.n_replay == 0
    half = np.concatenate([np.tile(np.array([1, 0, 0, 0], np.float32), 4), np.ones(16, np.float32)])
    out = h(make_batch(2, rewards=half), 2, mini_batch_rows=32, group_size=4)
    assert h.last_plan.n_zero_variance == 16 and h.last_plan.n_replay == 16 and len(out) == 32
    plain = hook(tau_max=None)  # replay_ratio 0.5 without the option: 8 replay rows, 16 + 8 fresh + replay
    plain(make_batch(1, rewards=rewards), 1, mini_batch_rows=32, group_size=4)
    plain(make_batch(2, rewards=half), 2, mini_batch_rows=32, group_size=4)
    assert plain.last_plan.n_replay == 8


def test_max_uses_and_age_decay_act_through_the_buffer():
    h = hook(max_uses=1, tau_max=None, replay_ratio=1.0)
    rewards = np.tile(np.array([1, 0, 0, 0], np.float32), 8)
    for t in range(1, 4):
        h(make_batch(t, rewards=rewards), t, mini_batch_rows=32, group_size=4)
    assert h.buffer.total_evicted_uses > 0 and h.last_plan.metrics["buffer/evicted_uses"] == h.buffer.total_evicted_uses
    d = hook(age_decay=0.01, tau_max=None, replay_ratio=0.25)
    for t in range(1, 5):
        d(make_batch(t, rewards=rewards), t, mini_batch_rows=32, group_size=4)
    assert d.last_plan.metrics["replay/age_max"] == 1  # a steep decay draws only the youngest rows (32 stored)


def test_options_verl_cannot_honour_are_refused():
    with pytest.raises(ValueError, match=r"ReplayConfig\.max_drift=0\.5 is invalid; allowed: None \(the verl legacy integration"):
        hook(max_drift=0.5)
    with pytest.raises(ValueError, match=r"ReplayConfig\.fill_filtered=True is invalid; allowed: false with filter_zero_variance"):
        split_config({"fill_filtered": True, "filter_zero_variance": False})
