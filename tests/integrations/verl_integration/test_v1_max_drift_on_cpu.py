"""replay.max_drift through verl 0.9.1's real v1 `fit()` on CPU (v1_driver.py says what is faked): each replay row's
drift from the policy about to update is measured on log-probs verl's actor computes for it; a row above the bound
leaves the loss (its response mask is zeroed, so the token mean is over the rows kept) and the buffer and row store;
fresh rows are never touched."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl.protocol")
ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

import v1_driver  # noqa: E402
from v1_driver import run_fit  # noqa: E402
from v1_setup import MODES, RATIO, SHAPE, by_step, empty_tq, replay_cls, tq_cluster, v1_config  # noqa: E402,F401

from grpo_replay.integrations.verl.v1_store import is_store_key  # noqa: E402

DRIFT_KEYS = ("replay/drift_dropped", "replay/drift_mean", "replay/drift_max", "buffer/evicted_drift")


@pytest.fixture
def masks_seen(monkeypatch):
    """Per actor update: {key: counted tokens of its response mask} as the update read it."""
    seen, real = [], v1_driver.FakeActorWG.update_actor

    def update_actor(self, batch):
        rows = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
        seen.append({k: int(rows["response_mask"][j].sum()) for j, k in enumerate(batch.keys)})
        return real(self, batch)

    monkeypatch.setattr(v1_driver.FakeActorWG, "update_actor", update_actor)
    return seen


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", MODES)
def test_v1_tight_bound_drops_replay_rows_from_the_loss_and_the_store(tq_cluster, tmp_path, mode, masks_seen):
    empty_tq()
    t = run_fit(replay_cls(mode), v1_config(tmp_path, mode, *RATIO, "replay.max_drift=1e-12",
                                            "replay.filter_zero_variance=false"))
    n_fresh = SHAPE[mode][0]
    for m in t.step_metrics.values():  # (separate_async: the step's last local update)
        # every replayed row drifted past 1e-12: none reached the loss, so none is counted as replayed
        assert m["replay/count"] == 0 and m["replay/share"] == 0.0 and "replay/abs_adv" not in m
    assert any(m["replay/drift_dropped"] for m in t.step_metrics.values())
    dropped = sum(1 for seen in masks_seen for k in seen if is_store_key(k))
    assert dropped > 0 and t.replay_store.buffer.total_evicted_drift == dropped
    for seen in masks_seen:
        fresh = [k for k in seen if not is_store_key(k)]
        replay = [k for k in seen if is_store_key(k)]
        assert len(fresh) == n_fresh and any(seen[k] for k in fresh)  # fresh rows keep their masks
        assert all(seen[k] == 0 for k in replay)  # replay rows left the loss
    # the dropped rows left the row store with the buffer: a stored row per buffer row
    assert t.replay_store.rows.ids().tolist() == sorted(t.replay_store.live_ids().tolist())


@pytest.mark.timeout(900)
def test_v1_loose_bound_drops_nothing_and_trains_as_without_it(tq_cluster, tmp_path, masks_seen):
    empty_tq()
    free = run_fit(replay_cls("sync"), v1_config(tmp_path / "free", "sync", *RATIO))
    empty_tq()
    loose = run_fit(replay_cls("sync"), v1_config(tmp_path / "loose", "sync", *RATIO, "replay.max_drift=100"))
    assert all(m["replay/drift_dropped"] == 0 for m in loose.step_metrics.values())
    assert any("replay/drift_max" in m for m in loose.step_metrics.values())  # measured
    assert loose.replay_store.buffer.total_evicted_drift == 0
    a, b = free.actor_rollout_wg.updates, loose.actor_rollout_wg.updates
    assert [u["keys"] for u in a] == [u["keys"] for u in b]
    for ua, ub in zip(a, b, strict=True):
        for k in ua["keys"]:
            assert all(torch.equal(ua["rows"][k][f], ub["rows"][k][f]) for f in ua["rows"][k])
    assert torch.equal(free.model.table, loose.model.table)
    assert any(is_store_key(k) for u in b for k in u["keys"])  # rows were replayed
    for s, m in free.step_metrics.items():
        same = {k: v for k, v in m.items() if "timing" not in k and "perf/" not in k}
        other = {k: v for k, v in loose.step_metrics[s].items() if k not in DRIFT_KEYS and "timing" not in k
                 and "perf/" not in k}
        assert same == other
