"""ReplayAsyncGRPOTrainer through real `AsyncGRPOTrainer.train()` runs on CPU: an in-process rollout worker generates
with a copy of the tiny Qwen2 (kept current by a weight copy), stamps model versions and feeds TRL's rollout queue;
TRL's tree attention runs through a PyTorch stand-in for its GPU kernel (async_local.py)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl")
import torch  # noqa: E402

from async_setup import make_async_trainer, params, reward_some_flat  # noqa: E402

METRICS = ("replay/share", "replay/count", "frac_zero_var_groups", "buffer/size", "replay/age_mean",
           "replay/age_max", "replay/abs_adv", "fresh/abs_adv", "buffer/evicted_age", "replay/age_bound", "replay/inserted")


def _samples(record, replay):
    return [s for s in record["samples"] if bool(s["replay_is_replay"]) == replay]


@pytest.mark.slow
def test_ages_share_replayed_fields_and_rows(tmp_path):
    # 12 samples a step (4 x 3 micro-batches): 8 fresh + 4 replayed; ages bounded by min(tau_max=3, max_staleness=4).
    # A step's samples are storable two chunks later (the dataloader composes one step ahead of the update).
    t = make_async_trainer(tmp_path, gradient_accumulation_steps=3, max_steps=6, replay_tau_max=3, max_staleness=4)
    t.train()
    hist = list(t.replay_history)
    assert [h["fresh_rows"] + h["replay_rows"] for h in hist] == [12] * 6
    assert [h["replay_rows"] for h in hist] == [0, 0, 4, 4, 4, 4]  # warm-up, then the buffer holds step 0's rows
    ages = [a for h in hist for a in h["replay_ages"]]
    assert ages and min(ages) >= 1 and max(ages) <= 3 and t.replay_age_bound == 3
    assert t.replay_composer.buffer.total_evicted_age > 0  # the bound bit
    for h in hist:  # the age is the version the row was drawn at minus the one that generated it
        assert all(v + a <= h["version"] for v, a in zip(h["replay_birth_steps"], h["replay_ages"]))

    # Every replayed sample is a sample trained on earlier, bit for bit as the loss receives it.
    fresh = {}
    for h in hist:
        for s in _samples(h, replay=False):
            fresh.setdefault((int(s["group_id"]), tuple(s["input_ids"].tolist())), []).append((h["step"], s))
    for h in hist:
        for r in _samples(h, replay=True):
            matches = fresh[(int(r["group_id"]), tuple(r["input_ids"].tolist()))]
            step, f = next((st, f) for st, f in matches if f["model_version"] == r["model_version"])
            assert step < h["step"]
            assert torch.equal(f["completion_mask"], r["completion_mask"])
            assert torch.equal(f["old_log_probs"], r["old_log_probs"])
            assert np.float32(f["advantage"]) == np.float32(r["advantage"])

    # One non-empty packed row per micro-batch on the process, three micro-batches a step.
    assert len(t.replay_rows_per_process) == 18 and min(t.replay_rows_per_process) >= 1
    logs = [row for row in t.state.log_history if "loss" in row]
    assert all(k in logs[-1] for k in METRICS), sorted(set(METRICS) - set(logs[-1]))
    assert [row["replay/share"] for row in logs] == pytest.approx([0, 0] + [1 / 3] * 4)
    assert all(row["replay/age_bound"] == 3 for row in logs)


@pytest.mark.slow
def test_fill_filtered_replaces_zero_variance_samples(tmp_path):
    # A third of the prompts score 1.0 for every completion: their samples are replaced by replay rows.
    t = make_async_trainer(tmp_path, reward=reward_some_flat, max_steps=6, replay_fill_filtered=True, max_staleness=8)
    t.train()
    chunks = list(t.replay_composer.history)
    assert all(c["fresh_taken"] == 8 for c in chunks)  # the worker generates what plain AsyncGRPO would take
    assert all(h["fresh_rows"] + h["replay_rows"] == 8 for h in t.replay_history)  # and each update keeps its size
    for c in chunks:  # as many replay rows as zero-variance samples while the buffer (nothing evicted) has them
        expected = min(c["zero_variance_taken"], c["buffer_size"]) if c["chunk"] >= 1 else 0
        assert c["replay"] == expected and c["fresh"] + c["replay"] == 8, c
    full = [c["chunk"] for c in chunks if c["replay"] and c["replay"] == c["zero_variance_taken"]]
    assert full
    for h in t.replay_history:  # chunk i is step i: a step whose flat samples were all replaced trains none
        flat = [s for s in _samples(h, replay=False) if s["metrics"]["reward_std"] == 0]
        assert not (h["step"] in full and flat)
        assert h["replay_rows"] == chunks[h["step"]]["replay"]
    st = t.replay_composer.buffer.storage
    assert len(st) and (st.col("group_std")[st.valid_slots()] > 0).all()  # no zero-variance row is ever stored


@pytest.mark.slow
def test_replay_off_is_plain_async_grpo(tmp_path):
    a = make_async_trainer(tmp_path / "a", max_steps=3, replay_preset="grpo")
    a.train()
    b = make_async_trainer(tmp_path / "b", plain=True, max_steps=3)
    b.train()
    assert a.replay_composer is None
    assert torch.equal(params(a.model), params(b.model))
    loss = lambda t: [row["loss"] for row in t.state.log_history if "loss" in row]  # noqa: E731
    assert loss(a) == loss(b)


@pytest.mark.slow
def test_resume_continues_with_the_same_buffer(tmp_path):
    kw = dict(max_steps=5, save_strategy="steps", save_steps=2, replay_warmup_steps=1)
    a = make_async_trainer(tmp_path / "a", **kw)
    a.train()
    ckpt = tmp_path / "a" / "out" / "checkpoint-2"
    assert (ckpt / "replay_buffer.npz").exists() and (ckpt / "replay_async_state.pt").exists()
    b = make_async_trainer(tmp_path / "b", **kw)
    b.train(resume_from_checkpoint=str(ckpt))
    strip = lambda h: {k: v for k, v in h.items() if k != "samples"}  # noqa: E731
    assert [strip(h) for h in b.replay_history] == [strip(h) for h in list(a.replay_history)[2:]]
    assert sum(h["replay_rows"] for h in b.replay_history) > 0
    for x, y in zip(list(a.replay_history)[2:], b.replay_history):
        assert all(torch.equal(p[k], q[k]) for p, q in zip(x["samples"], y["samples"]) for k in ("input_ids", "old_log_probs"))
    assert torch.equal(params(a.model), params(b.model))
    assert a.replay_composer.buffer.state_dict()["storage"].keys() == b.replay_composer.buffer.state_dict()["storage"].keys()
    assert len(a.replay_composer.buffer) == len(b.replay_composer.buffer)


@pytest.mark.slow
def test_token_budget_rows_within_budget(tmp_path):
    t = make_async_trainer(tmp_path, token_budget=40, max_steps=4, replay_max_uses=1)
    t.train()
    logs = [row for row in t.state.log_history if "loss" in row]
    assert t.replay_composer.buffer.total_evicted_uses > 0  # each stored row replayed once, then gone
    assert logs[-1]["buffer/evicted_uses"] == t.replay_composer.buffer.total_evicted_uses
    assert max(row["batch/row_tokens_max"] for row in logs) <= 40
    assert len(t.replay_rows_per_process) == 8 and min(t.replay_rows_per_process) >= 1
    chunks = [c for c in t.replay_composer.history if c["chunk"] >= 1 and c["buffer_size"] >= 2]
    assert chunks and all(c["replay"] == 2 and c["fresh"] == 6 for c in chunks)
    assert sum(h["replay_rows"] for h in t.replay_history) > 0
    assert all(1 <= a <= t.replay_age_bound for h in t.replay_history for a in h["replay_ages"])
