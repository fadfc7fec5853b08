"""The step-plan contract (tests/integrations/test_step_plan_contract.py) for verl's two trainers, in their environment:
the same fresh batches, fed through the legacy `ReplayHook` and the v1 trainer's store (`TQReplayStore.compose`, the
call `_update_actor` makes, and its metrics row), store the same rows as the core session (the built-in trainer's
path), train the replay share `step_plan.plan_step` gives for verl's unit (what the preflight prints), and log only
declared metric keys.

The shape: 4 prompts x rollout.n 3 = 12 rows a step, one PPO mini-batch, ppo_micro_batch_size_per_gpu 2, so verl's
unit is lcm(3, 2) = 6 rows: 12 fresh + 6 planned replay rows train as planned; a step with one zero-variance group
has 9 fresh rows and asks round(4.5) = 4 replay rows, which the unit holds nearest as 3 (9 + 3).
"""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

pytest.importorskip("verl.protocol")

from verl_batches import make_batch  # noqa: E402
from helpers import stored_rows as stored, undeclared_metric_keys as undeclared  # noqa: E402

from grpo_replay import ReplayConfig, ReplaySession  # noqa: E402
from grpo_replay import metric_names as mn  # noqa: E402
from grpo_replay.advantage import nonzero_variance_mask  # noqa: E402
from grpo_replay.integrations.verl import ReplayHook, VerlReplaySettings, to_rollout_batch  # noqa: E402
from grpo_replay.step_plan import plan_step  # noqa: E402

N, PROMPTS, MICRO, FIRST, STEPS = 3, 4, 2, 3, 3
UNIT = 6  # lcm(rollout.n, dp x micro) x one mini-batch
CFG = ReplayConfig(replay_ratio=0.5, warmup_steps=0)


def batches() -> list:
    """The steps' verl batches: the last step's first group has no reward variance."""
    out = []
    for t in range(FIRST, FIRST + STEPS):
        rewards = np.array([0, 1, 1] * PROMPTS, dtype=np.float32) if t < FIRST + STEPS - 1 else \
            np.array([1, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0], dtype=np.float32)
        out.append(make_batch(t, n_prompts=PROMPTS, n=N, seed=7, rewards=rewards))
    return out


def prefill(buffer) -> None:
    for t in range(FIRST):
        rb, keys = to_rollout_batch(make_batch(t, n_prompts=8, n=N, seed=1, rewards=np.array([0, 1, 0.5] * 8)), t)
        buffer.add(rb, t, prompt_keys=keys)


def plan_of(rb) -> float:
    """The plan's share for a step of `rb`: its non-zero-variance rows composed, the others spare."""
    used = int(nonzero_variance_mask(rb.rewards, rb.group_ids).sum())
    return plan_step(used, CFG, UNIT, spare=len(rb) - used, group_size=N).share


def run_legacy(steps):
    hook = ReplayHook(CFG, VerlReplaySettings())
    prefill(hook.buffer)
    shares, keys = [], set()
    for t, batch in enumerate(steps, FIRST):
        hook(batch, t, dp_size=1, mini_batch_rows=PROMPTS * N, group_size=N, micro_batch_size_per_gpu=MICRO)
        p = hook.last_plan
        assert p.n_total % UNIT == 0
        shares.append((p.n_replay / p.n_total, p.metrics[mn.REPLAY_SHARE], plan_of(to_rollout_batch(batch, t)[0])))
        keys |= set(p.metrics)
    return stored(hook.buffer), shares, keys


def run_v1(steps):
    from grpo_replay.integrations.verl.trainer_v1 import ReplayV1Mixin
    from grpo_replay.integrations.verl.v1_store import FreshRows, TQReplayStore

    store = TQReplayStore(CFG, VerlReplaySettings())
    prefill(store.buffer)
    shares, keys = [], set()
    for t, batch in enumerate(steps, FIRST):
        rb, pkeys = to_rollout_batch(batch, t)
        fresh = FreshRows(keys=[f"{t}_{i}_0" for i in range(len(rb))], tags=[{} for _ in range(len(rb))],
                          rewards=rb.rewards, advantages=rb.advantages, group_ids=rb.group_ids, prompt_keys=pkeys,
                          birth=np.full(len(rb), t, dtype=np.int64))
        plan = store.compose(fresh, t, unit=UNIT)
        used, n_rep = plan.fresh_used, len(plan.replay_ids)
        assert (len(used) + n_rep) % UNIT == 0
        me = types.SimpleNamespace(replay_store=store, replay_metrics={})
        fresh_adv = rb.advantages[torch.from_numpy(used[used < len(rb)])]
        metrics = ReplayV1Mixin._replay_log(me, plan, fresh_adv, int((used >= len(rb)).sum()), n_rep,
                                            len(used) + n_rep, 0, t, 0, None)
        shares.append((n_rep / (len(used) + n_rep), metrics[mn.REPLAY_SHARE], plan_of(rb)))
        keys |= set(metrics)
        rows = np.flatnonzero(plan.nonzero)  # `_stage` then `step`: the non-zero-variance rows enter after the update
        store.defer(fresh, rows)
        store.flush()
    return stored(store.buffer), shares, keys


def core_rows(steps) -> list:
    """The built-in trainer's path (the core session, unit 1): what enters the buffer does not depend on the unit."""
    session = ReplaySession(CFG, seed=0)
    prefill(session.buffer)
    for t, batch in enumerate(steps, FIRST):
        rb, pkeys = to_rollout_batch(batch, t)
        keep = torch.nonzero(nonzero_variance_mask(rb.rewards, rb.group_ids)).flatten()
        session.compose(rb.select(keep), t)
        session.defer(rb.select(keep), prompt_keys=pkeys[keep.numpy()])
        session.flush()
    return stored(session.buffer)


@pytest.fixture(scope="module")
def runs():
    steps = batches()
    return {"legacy": run_legacy(steps), "v1": run_v1(batches()), "core": core_rows(batches())}


def test_verl_trainers_store_the_rows_the_core_stores(runs):
    assert runs["legacy"][0] == runs["core"] and runs["v1"][0] == runs["core"]
    assert len(runs["core"]) == 8 * N * FIRST + (PROMPTS * STEPS - 1) * N


@pytest.mark.parametrize("name", ["legacy", "v1"])
def test_verl_trainers_train_the_share_their_plan_says(runs, name):
    shares = runs[name][1]
    assert all(got == pytest.approx(logged) == pytest.approx(planned) for got, logged, planned in shares), shares
    assert [round(s[2], 4) for s in shares] == [0.3333, 0.3333, 0.25]  # 12 + 6, 12 + 6, 9 + 3


@pytest.mark.parametrize("name", ["legacy", "v1"])
def test_verl_trainers_log_only_declared_metric_keys(runs, name):
    keys = {k for k in runs[name][2] if mn.is_replay_key(k)}
    assert {mn.REPLAY_SHARE, mn.REPLAY_COUNT, mn.FRESH_COUNT, mn.ZERO_VARIANCE_SHARE, mn.BUFFER_SIZE} <= keys, keys
    assert not undeclared(keys), undeclared(keys)
