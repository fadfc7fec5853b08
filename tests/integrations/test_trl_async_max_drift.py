"""replay.max_drift in ReplayAsyncGRPOTrainer through real `AsyncGRPOTrainer.train()` runs on CPU (async_setup.py): a
replayed sample whose drift on TRL's loss forward exceeds the bound leaves the loss terms, TRL's token normaliser and
the buffer; fresh samples never do."""
from __future__ import annotations

import pytest

pytest.importorskip("trl")
import torch  # noqa: E402

from async_setup import make_async_trainer, params  # noqa: E402

DRIFT_KEYS = ("replay/drift_dropped", "replay/drift_mean", "replay/drift_max", "buffer/evicted_drift")


def _logs(t):
    return [row for row in t.state.log_history if "loss" in row]


def _loss_tokens(samples):
    return sum(int(torch.as_tensor(s["completion_mask"]).sum()) for s in samples)


# 4 samples a micro-batch (fresh and replayed share the packed row), and 1 (a row holding only a replayed sample).
@pytest.mark.parametrize("batch,accumulation", [(4, 2), (1, 4)])
def test_tight_bound_drops_every_replayed_sample_and_no_fresh_one(tmp_path, batch, accumulation):
    t = make_async_trainer(tmp_path, max_steps=4, replay_max_drift=1e-12, per_device_train_batch_size=batch,
                           gradient_accumulation_steps=accumulation)
    t.train()
    hist, logs = list(t.replay_history), _logs(t)
    dropped = [row["replay/drift_dropped"] for row in logs]
    assert [h["replay_rows"] for h in hist] == dropped and sum(dropped) > 0  # all replayed ones, so no fresh one
    # replay/count and replay/share are of the samples that reached the loss: none of the replayed ones
    assert all(row["replay/count"] == 0 and row["replay/share"] == 0.0 for row in logs)
    assert [row["fresh/count"] for row in logs] == [h["fresh_rows"] for h in hist]
    assert min(row["replay/drift_max"] for row in logs if row["replay/drift_dropped"]) > 1e-12
    # Each dropped row is evicted once: the next chunk, composed before the update, may have drawn it again (and it is
    # dropped again there).
    seqs = {int(s["replay_buffer_seq"]) for h in hist for s in h["samples"] if s["replay_is_replay"]}
    assert t.replay_composer.buffer.total_evicted_drift == len(seqs) == logs[-1]["buffer/evicted_drift"] > 0
    for h, row in zip(hist, logs):  # TRL's normaliser (the loss tokens it counts) holds the fresh samples' only
        fresh = [s for s in h["samples"] if not s["replay_is_replay"]]
        assert row["batch/trained_tokens_per_step"] == _loss_tokens(fresh)
        assert _loss_tokens(fresh) < _loss_tokens(h["samples"]) or not h["replay_rows"]


@pytest.mark.slow
def test_loose_bound_drops_nothing_and_keeps_the_records_of_a_run_without_it(tmp_path):
    loose = make_async_trainer(tmp_path / "a", max_steps=4, replay_max_drift=100.0)
    loose.train()
    free = make_async_trainer(tmp_path / "b", max_steps=4)
    free.train()
    logs = _logs(loose)
    assert sum(h["replay_rows"] for h in loose.replay_history) > 0
    assert [row["replay/drift_dropped"] for row in logs] == [0] * 4 and logs[-1]["buffer/evicted_drift"] == 0
    assert any(row.get("replay/drift_mean", 0) > 0 for row in logs)  # measured on the replayed samples
    assert torch.equal(params(loose.model), params(free.model))

    def strip(h):
        return {k: v for k, v in h.items() if k != "samples"}

    assert [strip(h) for h in loose.replay_history] == [strip(h) for h in free.replay_history]

    def records(t):
        return [{k: v for k, v in row.items() if k not in DRIFT_KEYS and not k.startswith("perf/")
                 and "time" not in k and "per_second" not in k} for row in t.state.log_history]

    assert records(loose) == records(free)


def test_a_dropped_sample_leaves_the_loss_terms_and_the_normaliser(tmp_path):
    """On TRL's real compute_loss: a micro-batch of two fresh samples and one replayed sample above the bound has the
    loss and gradient of the micro-batch of the two fresh samples alone."""
    from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer, DataCollatorForRollout
    from trl.experimental.async_grpo.packing import TreeRow

    from grpo_replay.integrations.trl.async_drift import SEQ_KEY, row_seqs
    from grpo_replay.integrations.trl.async_samples import sample_from_state

    t = make_async_trainer(tmp_path, max_steps=2, replay_max_drift=1e-12)
    t.train()  # the policy has moved past the version that sampled step 0's samples
    f1, f2, old = (sample_from_state(s) for s in list(t.replay_history)[0]["samples"][:3])
    replayed = {**old, "replay_is_replay": True, "replay_buffer_seq": 10**6}  # no such stored row: nothing evicted
    collate = DataCollatorForRollout(t.processing_class.pad_token_id, 1)

    def loss_and_grad(samples, loss_fn):
        row = TreeRow()
        for s in samples:
            row.add(s)
        batch = collate([[row]])
        batch[SEQ_KEY] = row_seqs([row])
        t.model.zero_grad()
        loss = loss_fn(t.model, batch)
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in t.model.parameters() if p.grad is not None])

    bounded = loss_and_grad([f1, f2, replayed], t.compute_loss)
    kept = loss_and_grad([f1, f2], lambda m, b: AsyncGRPOTrainer.compute_loss(t, m, b))
    with_it = loss_and_grad([f1, f2, replayed], lambda m, b: AsyncGRPOTrainer.compute_loss(t, m, b))
    assert t._replay_drift[-1].dropped.tolist() == [True]
    assert torch.allclose(bounded[0], kept[0], rtol=1e-5, atol=1e-7)
    assert torch.allclose(bounded[1], kept[1], rtol=1e-4, atol=1e-7)
    assert not torch.allclose(bounded[1], with_it[1], rtol=1e-4, atol=1e-7)  # the replayed sample had a gradient
