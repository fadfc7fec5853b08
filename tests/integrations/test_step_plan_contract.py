"""One contract for the trainers that run in this environment: the same fresh batches, fed through each trainer's own
adapter, store the same rows, train the replay share the step plan (`step_plan.plan_step`, what the preflight prints)
gives for that trainer's unit, and log only declared metric keys (each trainer's own metrics code driven: the built-in
loop's row, TRL sync's log and `--backend trl`'s metrics.jsonl row, TRL async's step log). verl's two trainers have the same contract in
tests/integrations/verl_integration/test_step_plan_contract_verl.py (their environment).

The shape is TRL's common small one: 6 fresh rows a step (2 groups of 3), replay_ratio 0.5 (3 replay rows planned):
- the built-in trainer (unit 1, nothing cut): 6 + 3;
- TRL sync, per_device_train_batch_size 3 x steps_per_generation 2 (unit 2): 6 + 2 (the nearer ratio on a tie: the
  fewer rows), not a refusal;
- TRL async, 9 samples a step (a fixed total): 6 + 3.
Every buffer starts from the same stored rows, so each step draws from a full buffer.
"""
from __future__ import annotations

import sys
import types
from collections import defaultdict, deque
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
pytest.importorskip("trl")

from grpo_replay import ReplayConfig, ReplaySession  # noqa: E402
from grpo_replay import metric_names as mn  # noqa: E402
from grpo_replay.advantage import nonzero_variance_mask  # noqa: E402
from grpo_replay.step_metrics import HEAVY, ReplayRecord  # noqa: E402
from grpo_replay.step_plan import Unit, fixed_fresh, plan_step  # noqa: E402
from helpers import make_batch, stored_rows as stored, undeclared_metric_keys as undeclared  # noqa: E402

G, GROUPS, STEPS, FIRST = 3, 2, 3, 3  # group size, groups a step, steps, the first step (rows 0-2 are stored)
CFG = ReplayConfig(replay_ratio=0.5, warmup_steps=0)


def fresh_batches() -> list:
    """The steps' fresh batches: every group has reward variance but the first group of the last step."""
    out = []
    for t in range(FIRST, FIRST + STEPS):
        rewards = torch.tensor([0.0, 1.0, 1.0] * GROUPS) if t < FIRST + STEPS - 1 else torch.tensor([1.0, 1, 1, 0, 1, 0])
        out.append(make_batch(GROUPS, G, step=t, seed=t, rewards=rewards))
    return out


def prefill(buffer) -> None:
    for t in range(FIRST):
        buffer.add(make_batch(12, G, step=t, seed=100 + t, rewards=torch.tensor([0.0, 1.0, 0.5] * 12)), t)


# --- the adapters -------------------------------------------------------------------------------------------
def run_builtin(batches):
    """The built-in trainer's step (trainer/loop.py): filter zero-variance groups, compose (unit 1), insert."""
    session = ReplaySession(CFG, seed=0)
    prefill(session.buffer)
    shares, keys = [], set()
    for fresh in batches:
        t = int(fresh.birth_step[0])
        keep = nonzero_variance_mask(fresh.rewards, fresh.group_ids)
        fresh = fresh.select(torch.nonzero(keep).flatten())
        fitted = session.compose(fresh, t)
        session.defer(fresh)
        session.flush()
        metrics = builtin_row(session, keep, fitted.batch, t)
        shares.append((metrics[mn.REPLAY_SHARE], plan_step(len(fresh), CFG, 1, group_size=G).share))
        keys |= set(metrics)
    return stored(session.buffer), shares, keys, None


def builtin_row(session, keep, update, t: int) -> dict:
    """The replay entries of the built-in trainer's metrics row (`loop._replay_metrics`), with every loss statistic
    and a row left out of the insert, so that each key it can log is logged."""
    from grpo_replay.trainer.loop import NONFINITE_KEY, _replay_metrics

    shape = update.completion_mask.shape
    tokens = {"ratio": torch.ones(shape), "clipped": torch.zeros(shape, dtype=torch.bool),
              "mask": update.completion_mask.bool()}
    run = types.SimpleNamespace(cfg=types.SimpleNamespace(group_size=G, replay=CFG), session=session)
    gen = types.SimpleNamespace(keep=keep)  # (N,) the generated rows with reward variance
    out = types.SimpleNamespace(stats={"token_stats": tokens, NONFINITE_KEY: 1}, gen=gen, update=update)
    return _replay_metrics(run, t, out)


def trl_output(fresh) -> tuple[dict, torch.Tensor]:
    """TRL's dict of one generation (`_generate_and_score_completions`), with TRL's old log-probs, and its rewards."""
    out = {"prompt_ids": fresh.prompt_ids, "prompt_mask": fresh.prompt_mask, "completion_ids": fresh.completion_ids,
           "completion_mask": fresh.completion_mask, "old_per_token_logps": fresh.behaviour_logps,
           "advantages": fresh.advantages, "num_items_in_batch": fresh.completion_mask.sum()}
    return out, fresh.rewards[:, None]


def run_trl_sync(tmp_path, batches):
    from grpo_replay.trainer.trl import metrics as trl_metrics
    from test_trl import make_trainer

    trainer = make_trainer(tmp_path, replay_preset="paper", replay_ratio=0.5, replay_warmup_steps=0,
                           per_device_train_batch_size=3, steps_per_generation=2, gradient_accumulation_steps=2,
                           num_generations=G)
    prefill(trainer.replay_buffer)
    shares = []
    for fresh in batches:
        trainer.state.global_step = t = int(fresh.birth_step[0])
        out, rewards = trl_output(fresh)
        trainer._replay_compose(out, rewards)
        trainer._replay_flush(log=True)  # the end of the generation's accumulation window
        rows = trainer.replay_history[-1]
        shares.append((rows["replay_rows"] / (rows["replay_rows"] + rows["fresh_rows"]),
                       plan_step(len(fresh), trainer.replay_config, 2, group_size=G).share))
        assert trainer._metrics["train"][mn.REPLAY_SHARE][-1] == pytest.approx(shares[-1][0]), t
    logged = trainer._metrics["train"]
    # `--backend trl`'s metrics.jsonl row, made from TRL's log of the step (the window's means)
    logs = {"reward": 0.5, **{k: sum(v) / len(v) for k, v in logged.items() if v}}
    backend_row = trl_metrics.metrics_row(logs, FIRST + STEPS, GROUPS * G)
    return stored(trainer.replay_buffer), shares, set(logged) | set(backend_row), list(trainer.replay_history)


def sample_of(fresh, i: int, t: int) -> dict:
    """Row i of `fresh` as a TRL async sample (the queue's dict), born at model version t."""
    p = fresh.prompt_ids[i][fresh.prompt_mask[i].bool()]
    L = int(fresh.completion_lengths()[i])
    ids = torch.cat([p, fresh.completion_ids[i, :L]])
    mask = torch.cat([torch.zeros(len(p), dtype=torch.long), fresh.completion_mask[i, :L].long()])
    logps = torch.cat([torch.zeros(len(p)), fresh.behaviour_logps[i, :L]])
    group = fresh.group_ids[fresh.group_ids == fresh.group_ids[i]]
    std = float(fresh.rewards[fresh.group_ids == fresh.group_ids[i]].std()) if len(group) > 1 else 0.0
    return {"input_ids": ids.numpy(), "completion_mask": mask.numpy(), "old_log_probs": logps.numpy(),
            "advantage": float(fresh.advantages[i]), "group_id": 10 * t + int(fresh.group_ids[i]),
            "metrics": {"reward_std": std}, "model_version": t}


def run_trl_async(batches):
    from grpo_replay.integrations.trl.async_composer import AsyncComposer

    S = 9
    assert fixed_fresh(CFG, S, G) == GROUPS * G  # the composer takes one fresh batch a step
    version = [FIRST]
    composer = AsyncComposer(CFG, max_staleness=10, chunk_size=S, seed=0, version=lambda: version[0], group_size=G)
    prefill(composer.buffer)
    queue = iter([sample_of(f, i, int(f.birth_step[0])) for f in batches for i in range(len(f))])
    stream = composer.stream(queue)
    shares, keys, records = [], set(), []
    for fresh in batches:
        version[0] = int(fresh.birth_step[0])
        chunk = [next(stream) for _ in range(S)]
        composer.trained([s["replay_serial"] for s in chunk])
        h = composer.history[-1]
        shares.append((h["replay"] / (h["replay"] + h["fresh"]),
                       plan_step(GROUPS * G, CFG, Unit(total=S), group_size=G).share))
        keys |= async_logged(composer, chunk, version[0], records)
    version[0] += 1
    composer.session.flush()
    return stored(composer.buffer), shares, keys, records


def async_logged(composer, chunk: list, version: int, records: list) -> set[str]:
    """The keys `ReplayAsyncGRPOTrainer` logs of a step that trained `chunk` (`_replay_log_step`, then `log`'s
    buffer totals); its `replay_history` record joins `records`."""
    from grpo_replay.integrations.trl.replay_async_trainer import ReplayAsyncGRPOTrainer

    me = types.SimpleNamespace(
        _metrics={"train": defaultdict(list)}, replay_composer=composer, _replay_step=list(chunk), _replay_drift=[],
        _replay_drift_on=False, replay_age_bound=composer.age_bound, state=types.SimpleNamespace(global_step=version),
        model_version=version, replay_keep_samples=False, replay_history=deque(),
        accelerator=types.SimpleNamespace(is_main_process=True))
    ReplayAsyncGRPOTrainer._replay_log_step(me)
    assert me.replay_history[-1]["replay_rows"] == sum(bool(s["replay_is_replay"]) for s in chunk)
    records.append(me.replay_history[-1])
    return set(me._metrics["train"]) | set(composer.session.totals())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    batches = fresh_batches()
    return {"builtin": run_builtin(batches), "trl_sync": run_trl_sync(tmp_path_factory.mktemp("trl"), batches),
            "trl_async": run_trl_async(batches)}


def test_every_trainer_stores_the_same_rows(runs):
    rows = {name: r[0] for name, r in runs.items()}
    assert len(rows["builtin"]) == 3 * 12 * G + (STEPS * GROUPS - 1) * G  # the zero-variance group never enters
    assert rows["trl_sync"] == rows["builtin"] and rows["trl_async"] == rows["builtin"]


@pytest.mark.parametrize("name,share", [("builtin", 3 / 9), ("trl_sync", 2 / 8), ("trl_async", 3 / 9)])
def test_every_trainer_trains_the_share_its_plan_says(runs, name, share):
    shares = runs[name][1]
    assert all(got == pytest.approx(planned) for got, planned in shares), shares
    assert shares[0][1] == pytest.approx(share)


@pytest.mark.parametrize("name", ["builtin", "trl_sync", "trl_async"])
def test_every_trainer_logs_only_declared_metric_keys(runs, name):
    keys = {k for k in runs[name][2] if mn.is_replay_key(k)}
    assert {mn.REPLAY_SHARE, mn.REPLAY_COUNT, mn.FRESH_COUNT, mn.ZERO_VARIANCE_SHARE, mn.BUFFER_SIZE} <= keys, keys
    assert not undeclared(keys), undeclared(keys)


def test_both_trl_trainers_keep_one_history_record(runs):
    sync, async_ = runs["trl_sync"][3], runs["trl_async"][3]
    one = ReplayRecord.of(step=0, fresh_rows=0, replay_rows=0, replay_birth_steps=[], replay_ages=[])
    assert {frozenset(set(r) - set(HEAVY)) for r in sync + async_} == {frozenset(one)}
    for r in sync + async_:  # ages and births in the trainer's unit, one per replayed row
        assert len(r["replay_ages"]) == len(r["replay_birth_steps"]) == r["replay_rows"] == len(r["replay_advantages"])
        assert r["fresh_rows"] == len(r["fresh_advantages"]) and r["inserted"] is not None
        assert all(a >= 1 for a in r["replay_ages"]) and r["buffer_size"] is not None
