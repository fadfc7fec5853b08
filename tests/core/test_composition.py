import pytest
import torch

from grpo_replay import (COMPOSITIONS, ReplayBuffer, ReplayConfig, RolloutBatch, compose_batch, split_metrics,
                         ppo_clip_loss)
from grpo_replay.composition import PLANNED_ROWS
from helpers import make_batch


def _filled(cfg, n_groups=8, seed=0):
    buf = ReplayBuffer(cfg, seed=seed)
    for t in range(3):
        buf.add(make_batch(n_groups, 4, step=t, seed=t), t)
    return buf


@pytest.mark.parametrize("n_fresh_groups", [1, 3, 8])
def test_fresh_anchored_sizes(n_fresh_groups):
    buf = _filled(ReplayConfig(warmup_steps=0))
    fresh = make_batch(n_fresh_groups, 4, step=3, seed=9)
    out = compose_batch(fresh, buf, 3).batch
    n = len(fresh)
    assert len(out) == n + round(0.5 * n)
    assert (~out.is_replay).sum() == n and out.is_replay.sum() == round(0.5 * n)
    assert torch.equal(out.advantages[:n], fresh.advantages)  # every fresh row kept, in order


@pytest.mark.parametrize("preset", ["uniform_pool", "sigma_pool"])
def test_pool_keeps_total_fixed(preset):
    buf = _filled(ReplayConfig.from_preset(preset, warmup_steps=0))
    fresh = make_batch(8, 4, step=3, seed=9)
    out = compose_batch(fresh, buf, 3).batch
    assert len(out) == len(fresh)
    n_rep = int(out.is_replay.sum())
    assert n_rep == 8  # whole groups of 4, at most round(32 * 0.5 / 1.5) = 11 rows: never overshoots


@pytest.mark.parametrize("preset", ["uniform_pool", "sigma_pool"])
@pytest.mark.parametrize(
    "n_fresh_groups,group_size,ratio", [(1, 8, 0.5), (2, 8, 0.25), (3, 4, 1.0), (8, 8, 0.5), (5, 2, 3.0)]
)
def test_pool_whole_group_draws_never_overshoot_the_share(preset, ratio, n_fresh_groups, group_size):
    # One fresh group of 8 with replay_ratio 0.5 used to be displaced by a whole replayed
    # group of 8 (replay share 1.0); the share must stay <= replay_ratio / (1 + replay_ratio).
    buf = ReplayBuffer(ReplayConfig.from_preset(preset, warmup_steps=0, replay_ratio=ratio), seed=1)
    for t in range(3):
        buf.add(make_batch(6, group_size, step=t, seed=t, rewards=torch.arange(6 * group_size).float() % 3), t)
    fresh = make_batch(n_fresh_groups, group_size, step=3, seed=9)
    out = compose_batch(fresh, buf, 3).batch
    n = len(fresh)
    k = round(n * ratio / (1 + ratio))
    rep = out.select(out.is_replay.nonzero().flatten())
    assert len(out) == n and len(rep) <= k
    assert len(rep) == (k // group_size) * group_size  # as many whole groups as fit
    _, counts = torch.unique(rep.group_ids, return_counts=True)
    assert bool((counts == group_size).all())  # only whole groups


def test_pool_rollout_granularity_exact():
    buf = _filled(ReplayConfig(composition="pool", warmup_steps=0))
    fresh = make_batch(6, 4, step=3, seed=9)
    out = compose_batch(fresh, buf, 3).batch
    assert len(out) == 24 and int(out.is_replay.sum()) == 8


@pytest.mark.parametrize("composition", COMPOSITIONS.names())
@pytest.mark.parametrize("n_groups, ratio", [(2, 0.5), (3, 0.25), (5, 1.0), (4, 0.0), (3, 0.5)])
def test_a_step_is_planned_with_the_rows_its_composition_takes(composition, n_groups, ratio):
    """`PLANNED_ROWS` (what the step plan starts from) is the composition's own count."""
    buf = _filled(ReplayConfig(composition=composition, replay_ratio=ratio, warmup_steps=0))
    fresh = make_batch(n_groups, 4, step=3, seed=9)
    out = compose_batch(fresh, buf, 3).batch
    taken = (int((~out.is_replay).sum()), int(out.is_replay.sum()))
    assert taken == PLANNED_ROWS.get(composition)(len(fresh), ratio)


def test_warmup_and_grpo_compose_fresh_only():
    fresh = make_batch(4, 4, step=3, seed=9)  # after the stored rows' births (0-2), before warm-up ends (5)
    assert len(compose_batch(fresh, _filled(ReplayConfig(warmup_steps=5)), 3).batch) == len(fresh)
    assert compose_batch(fresh, _filled(ReplayConfig.grpo(warmup_steps=0)), 3).batch.is_replay.sum() == 0


def test_padding_and_metrics():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0), seed=0)
    buf.add(make_batch(4, 4, step=0, seed=1, max_prompt=9, max_completion=12), 0)
    fresh = make_batch(4, 4, step=2, seed=2, max_prompt=3, max_completion=4)
    out = compose_batch(fresh, buf, 2).batch
    P, C = out.prompt_ids.shape[1], out.completion_ids.shape[1]
    assert P >= 3 and C >= 4
    assert (out.prompt_mask[:, -1] == 1).all()  # prompts left-padded: last column always real
    assert (out.completion_mask[:, 0] == 1).all()  # completions right-padded
    assert (out.age(2)[out.is_replay] == 2).all() and (out.age(2)[~out.is_replay] == 0).all()
    loss, stats = ppo_clip_loss(out.behaviour_logps.clone(), out)
    m = split_metrics(out, 2, stats)
    assert m["fresh/count"] == 16 and m["replay/count"] == 8 and m["replay/share"] == pytest.approx(1 / 3)
    assert m["replay/age_hist"] == [0, 0, 8] and m["replay/ratio_mean"] == pytest.approx(1.0)
    assert m["fresh/clip_frac"] == 0.0


def test_metrics_of_a_batch_without_replay_rows_have_no_replay_placeholders():
    fresh = make_batch(2, 4, step=3, seed=2, max_prompt=3, max_completion=4)
    loss, stats = ppo_clip_loss(fresh.behaviour_logps.clone(), fresh)
    m = split_metrics(fresh, 3, stats)
    assert m["replay/count"] == 0 and m["replay/share"] == 0.0 and m["fresh/count"] == 8
    assert m["fresh/ratio_mean"] == pytest.approx(1.0) and "fresh/clip_frac" in m
    assert not [k for k in m if k.startswith("replay/") and k not in ("replay/count", "replay/share")]


def test_concat_rejects_mixed_ref():
    a = make_batch(1, 2, with_ref=True)
    b = make_batch(1, 2, with_ref=False)
    with pytest.raises(ValueError, match="ref_logps"):
        RolloutBatch.concat([a, b])


@pytest.mark.parametrize("preset", ["paper", "uniform_pool"])
def test_fresh_index_maps_kept_rows(preset):
    buf = _filled(ReplayConfig.from_preset(preset, warmup_steps=0))
    fresh = make_batch(6, 4, step=3, seed=9)
    out, idx = compose_batch(fresh, buf, 3)
    kept = out.select(torch.nonzero(~out.is_replay).flatten())
    assert len(idx) == len(kept) and bool((~out.is_replay[: len(idx)]).all())  # fresh rows come first
    assert torch.equal(kept.advantages, fresh.advantages[idx])
    assert torch.equal(kept.rewards, fresh.rewards[idx])
    if preset == "paper":
        assert torch.equal(idx, torch.arange(len(fresh)))
    else:
        assert len(idx) < len(fresh) and bool((idx[1:] > idx[:-1]).all())


@pytest.mark.parametrize("preset", ["paper", "uniform_pool"])
def test_replay_group_ids_are_unique_in_the_composed_batch(preset):
    """Replay rows get group ids past the fresh rows' (the buffer's keys would repeat them: [0,0,0,0,1,1,1,1,
    0,0,1,1]); rows of one stored group still share one id, in every view of the batch."""
    buf = ReplayBuffer(ReplayConfig.from_preset(preset, warmup_steps=0, replay_ratio=1.0), seed=0)
    buf.add(make_batch(2, 2, step=0, seed=1), 0)  # buffer keys 0 and 1
    fresh = make_batch(2, 4, step=1, seed=2)  # fresh ids 0 and 1
    out = compose_batch(fresh, buf, 1).batch
    rep = out.is_replay
    assert set(out.group_ids[~rep].tolist()) <= {0, 1}  # fresh ids as they came
    assert set(out.group_ids[rep].tolist()) == {2, 3}
    assert not set(out.group_ids[rep].tolist()) & set(out.group_ids[~rep].tolist())
    assert sorted(torch.unique(out.group_ids[rep], return_counts=True)[1].tolist()) == [2, 2]
    parts = torch.cat([p.group_ids for p in out.micro_batches()])
    assert torch.equal(parts, out.group_ids) and torch.equal(out.select(torch.arange(len(out))).group_ids, out.group_ids)


def test_fresh_anchored_whole_groups_never_overshoot():
    """12 fresh rows at 0.5 ask for 6 replay rows; with stored groups of 4 that is one group (two gave 8)."""
    buf = _filled(ReplayConfig(warmup_steps=0, granularity="group"))
    fresh = make_batch(3, 4, step=3, seed=9)
    out = compose_batch(fresh, buf, 3).batch
    assert int(out.is_replay.sum()) == 4 and int((~out.is_replay).sum()) == 12
    fresh = make_batch(4, 4, step=3, seed=9)  # 16 fresh rows ask for 8: two whole groups, exact
    assert int(compose_batch(fresh, buf, 3).batch.is_replay.sum()) == 8


def test_pool_fills_its_share_with_the_groups_that_fit():
    """A stored group of 8 against a share of 3 used to leave the share empty although groups of 2 and 1
    were stored: now they fill it."""
    for seed in range(6):
        buf = ReplayBuffer(ReplayConfig.uniform_pool(warmup_steps=0), seed=seed)
        for t, size in enumerate([8, 2, 1]):
            buf.add(make_batch(1, size, step=t, seed=t), t)
        fresh = make_batch(2, 4, step=3, seed=9)  # 8 rows at ratio 0.5: a share of round(8 / 3) = 3
        out, kept = compose_batch(fresh, buf, 3)
        assert int(out.is_replay.sum()) == 3 and len(kept) == 5 and len(out) == 8


# --- fill_filtered: the replay count is the number of rows the zero-variance filter removed ---------------
def _filled_buffer(**cfg):
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None, fill_filtered=True, **cfg), seed=0)
    buf.add(make_batch(8, 4, step=0, seed=0), 0)
    return buf


def test_fill_filtered_replays_as_many_rows_as_were_filtered():
    buf = _filled_buffer()
    fresh = make_batch(2, 4, step=1, seed=1)
    batch, idx = compose_batch(fresh, buf, 1, n_filtered=12)
    assert len(batch) == 8 + 12 and int(batch.is_replay.sum()) == 12 and idx.tolist() == list(range(8))
    # every group filtered: the update is replay rows only, as many as were generated
    empty = fresh.select(torch.arange(0))
    only, idx = compose_batch(empty, buf, 1, n_filtered=20)
    assert len(only) == 20 and bool(only.is_replay.all()) and len(idx) == 0
    # nothing filtered: no replay, whatever replay_ratio says
    none, _ = compose_batch(fresh, buf, 1, n_filtered=0)
    assert len(none) == 8 and not bool(none.is_replay.any())


def test_fill_filtered_keeps_warmup_and_needs_the_count():
    buf = _filled_buffer()
    buf.config = buf.config.replace(warmup_steps=5)
    batch, _ = compose_batch(make_batch(2, 4, step=1, seed=1), buf, 1, n_filtered=8)
    assert len(batch) == 8  # warm-up: no replay rows
    with pytest.raises(ValueError, match=r"compose_batch: n_filtered=None is invalid; allowed: an integer >= 0"):
        compose_batch(make_batch(2, 4, step=6, seed=1), buf, 6)


def test_without_fill_filtered_the_count_is_not_used():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None), seed=0)
    buf.add(make_batch(8, 4, step=0, seed=0), 0)
    batch, _ = compose_batch(make_batch(2, 4, step=1, seed=1), buf, 1, n_filtered=24)
    assert int(batch.is_replay.sum()) == 4  # round(0.5 * 8)


def test_composed_batch_carries_buffer_seq_with_minus_one_for_fresh_rows():
    buf = _filled_buffer()
    fresh = make_batch(2, 4, step=1, seed=1)
    batch, _ = compose_batch(fresh, buf, 1, n_filtered=4)
    seq = batch.buffer_seq
    assert seq[:8].tolist() == [-1] * 8 and (seq[8:] >= 0).all()
    assert batch.select(torch.arange(6, 12)).buffer_seq.tolist() == seq[6:12].tolist()
    assert RolloutBatch.concat([fresh, batch.select(torch.arange(8, 12))]).buffer_seq.tolist() == seq.tolist()[:8] + seq.tolist()[8:]
    assert fresh.buffer_seq is None and RolloutBatch.concat([fresh, fresh]).buffer_seq is None
