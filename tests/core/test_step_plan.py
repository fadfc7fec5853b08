"""The step plan (`step_plan.plan_step`) is what `ReplaySession.compose` trains with a full buffer, over random fresh
counts, ratios, compositions (group granularity included), units (row multiples and fixed totals) and spare rows;
and the plan's own rules at the shapes the engines meet."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_replay import ReplayConfig, ReplaySession
from grpo_replay.errors import ConfigError
from grpo_replay.step_plan import Unit, fit_rows, fixed_fresh, plan_step
from helpers import make_batch

STEP = 5  # after the stored rows' births (0-2) and warm-up (0)


def _full_session(cfg: ReplayConfig, group_size: int, seed: int) -> ReplaySession:
    """A session whose buffer holds far more rows than any step asks for, in whole groups of `group_size`."""
    s = ReplaySession(cfg, seed=seed)
    for t in range(3):
        rewards = torch.arange(40 * group_size).float() % 3  # every group has reward variance
        s.buffer.add(make_batch(40, group_size, step=t, seed=seed + t, rewards=rewards), t)
    return s


def _trained(fitted) -> tuple[int, int, int]:
    """(fresh rows, replay rows, spare rows) the fitted step trains."""
    rep = int(fitted.batch.is_replay.sum())
    return len(fitted.fresh_index), rep, fitted.plan.pad


CONFIGS = st.one_of(
    st.builds(lambda r: ReplayConfig(replay_ratio=r, warmup_steps=0), st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0])),
    st.builds(lambda r, p: ReplayConfig.from_preset(p, replay_ratio=r, warmup_steps=0),
              st.sampled_from([0.25, 0.5, 1.0, 3.0]), st.sampled_from(["uniform_pool", "sigma_pool"])),
    st.builds(lambda r: ReplayConfig(composition="pool", replay_ratio=r, warmup_steps=0),
              st.sampled_from([0.25, 0.5, 1.0])),
    st.builds(lambda r: ReplayConfig(granularity="group", replay_ratio=r, warmup_steps=0),
              st.sampled_from([0.25, 0.5, 1.0])),
)


@settings(max_examples=150, deadline=None)
@given(cfg=CONFIGS, groups=st.integers(1, 9), group_size=st.sampled_from([1, 2, 4, 8]),
       unit=st.integers(1, 12), spare=st.integers(0, 12), seed=st.integers(0, 50))
def test_the_plan_is_what_compose_trains_with_a_full_buffer_row_multiple(cfg, groups, group_size, unit, spare, seed):
    session = _full_session(cfg, group_size, seed)
    fresh = make_batch(groups, group_size, step=STEP, seed=seed + 7)
    plan = plan_step(len(fresh), cfg, unit, spare=spare, group_size=group_size)
    fitted = session.compose(fresh, STEP, unit=unit, spare=spare)
    assert fitted.plan == plan
    assert _trained(fitted) == (plan.kept, plan.replay, plan.pad)
    if not plan.whole:
        assert (plan.rows % unit == 0) or plan.rows == 0, plan
    if cfg.enabled and plan.replay == 0 and not plan.whole:
        assert plan.vanishes and not plan.realised, plan  # no replay row trains: flagged, and trainers refuse it
    if unit == 1:  # the built-in trainer: nothing is cut, the composition's own count
        assert (plan.replay, plan.cut, plan.pad) == (plan.planned, 0, 0)


@settings(max_examples=100, deadline=None)
@given(cfg=CONFIGS.filter(lambda c: c.enabled), total=st.integers(2, 40), group_size=st.sampled_from([1, 2, 4]),
       seed=st.integers(0, 50))
def test_the_plan_is_what_compose_trains_with_a_full_buffer_fixed_total(cfg, total, group_size, seed):
    session = _full_session(cfg, group_size, seed)
    n = fixed_fresh(cfg, total, group_size)
    fresh = make_batch(1, n, step=STEP, seed=seed + 7)  # one TRL group id per sample is not needed here
    fresh.group_ids = torch.arange(n) // group_size
    plan = plan_step(n, cfg, Unit(total=total), group_size=group_size)
    fitted = session.compose(fresh, STEP, unit=Unit(total=total), group_size=group_size)
    assert fitted.plan == plan
    assert (len(fitted.fresh_index), int(fitted.batch.is_replay.sum())) == (plan.kept, plan.replay)
    assert plan.kept + plan.replay + plan.extra == total and plan.extra >= 0


@pytest.mark.parametrize("fresh,unit,replay", [(6, 2, 2), (12, 4, 4), (8, 2, 4), (12, 1, 6), (16, 4, 8)])
def test_trl_small_shapes_train_the_replay_count_the_split_holds_nearest_to_the_ratio(fresh, unit, replay):
    """TRL's per-device 3 x steps_per_generation 2: 6 fresh + 3 planned replay rows in 2 micro-batches train 6 + 2
    (ratio 1/3 and 2/3 are as near 0.5: the fewer rows), not a refusal."""
    plan = plan_step(fresh, ReplayConfig(), unit)
    assert (plan.kept, plan.replay) == (fresh, replay) and plan.realised


def test_whole_group_draws_are_planned_as_the_composition_draws_them():
    """The paper-table recipe's pool arms: 1024 rows, whole groups of 8: round(1024 / 3) = 341 asked, 336 drawn."""
    plan = plan_step(1024, ReplayConfig.uniform_pool(), 1, group_size=8)
    assert (plan.ask, plan.planned, plan.replay, plan.kept) == (341, 336, 336, 688)
    assert plan_step(16, ReplayConfig.sigma_pool(), 1, group_size=4).replay == 4  # round(16 / 3) = 5: one group


def test_replay_that_would_vanish_is_flagged_and_never_lifted_at_unit_one():
    assert plan_step(1, ReplayConfig(), 1).vanishes  # round(0.5 * 1) = 0
    assert plan_step(8, ReplayConfig(), 8).vanishes  # one-row micro-batches: 0 or 8 replay rows, ratio 0 or 1: 0
    assert plan_step(4, ReplayConfig(), 4).vanishes
    assert not plan_step(1, ReplayConfig.grpo(), 4).vanishes  # replay off is not vanishing
    assert plan_step(2, ReplayConfig(replay_ratio=0.2), 2).vanishes  # round(0.4) = 0 asked


def test_a_composition_without_a_fixed_size_rule_is_refused_by_name():
    from grpo_replay.composition import COMPOSITIONS, KEPT_ROWS, PLANNED_ROWS

    name = "test_only_interleave"
    if name not in COMPOSITIONS:
        COMPOSITIONS.register(name)(lambda fresh, draw, n_replay, rng: COMPOSITIONS.get("fresh_anchored")(
            fresh, draw, n_replay, rng))
        PLANNED_ROWS.register(name)(lambda n_fresh, replay_ratio: (n_fresh, round(replay_ratio * n_fresh)))
        KEPT_ROWS.register(name)(lambda n_fresh, n_replay: n_fresh)
    cfg = ReplayConfig(composition=name)
    assert plan_step(8, cfg, 2).replay == 4  # a row multiple needs no rule of its own
    with pytest.raises(ConfigError, match=f"composition='{name}' has no rule for a step of a fixed size"):
        plan_step(8, cfg, Unit(total=8))


@pytest.mark.parametrize("kept,replay,unit,spare,expected", [
    (8, 5, 4, 0, (4, 0, 0)),  # replay rows first
    (8, 1, 4, 3, (1, 3, 0)),  # one replay row stays: spare rows fill the unit
    (8, 1, 4, 0, (1, 0, 1)),  # ... else the smallest-|A| fresh row goes
    (7, 0, 4, 0, (0, 0, 3)),  # nothing replayed: fresh rows go
    (2, 1, 4, 0, (0, 0, 0)),  # no multiple below: the engine's own batch
])
def test_the_one_trimming_rule(kept, replay, unit, spare, expected):
    fit = fit_rows(kept, replay, unit, spare)
    assert (fit.replay, fit.pad, fit.cut) == expected and fit.whole == (kept + replay < unit)


def test_agreement_over_processes_only_drops():
    fit = fit_rows(6, 4, 2, spare=5, agree=lambda rows: 9)  # another process composed 9 rows
    assert (fit.replay, fit.pad, fit.cut) == (2, 0, 0)


def test_compose_cuts_the_smallest_abs_advantage_fresh_rows():
    cfg = ReplayConfig(warmup_steps=0)
    session = _full_session(cfg, 4, 0)
    fresh = make_batch(2, 4, step=STEP, seed=3)  # 8 fresh rows; a short draw of 1 with unit 4: one fresh row goes
    fitted = session.compose(fresh, STEP, unit=Unit(multiple=3))
    plan = fitted.plan
    assert plan.rows % 3 == 0 and plan.replay == 4 and plan.cut == 0  # 8 + 4 = 12
    drop = int(fresh.advantages.abs().argmin())
    session2 = ReplaySession(cfg, seed=0)
    session2.buffer.add(make_batch(1, 1, step=0, seed=1, rewards=torch.tensor([1.0])), 0)
    out = session2.compose(fresh, STEP, unit=3)  # one stored row: 8 + 1 = 9 rows, a multiple of 3
    assert len(out.batch) == 9
    out = session2.compose(make_batch(2, 4, step=STEP + 1, seed=3), STEP + 1, unit=4)  # 8 + 1: cut one fresh row
    assert out.plan.cut == 1 and drop not in out.fresh_index.tolist() and len(out.batch) == 8
