"""Replay through verl 0.9.1's real v1 `fit()` loop, in its three trainer modes, on CPU (v1_driver.py says what
is faked).

One Ray cluster (4 CPUs) and one TransferQueue (2 storage units) for the module; each run gets a TransferQueue
emptied first, as a fresh process would have. Checked at the loss (the fake actor records every row it trains on):
replay rows' old log-probs / advantages (and router-replay, distillation and multi-modal fields) are bit-identical
to what the same row carried when it was trained fresh, they carry every field the actor update reads and no
other, ages lie in [1, tau_max] versions, the replay share is as configured once warm, `replay=grpo` trains
exactly as verl's own trainer of the mode, a resume from a mid-run checkpoint continues the same draws, and no
stored row is in TransferQueue between updates (so neither verl's sampler nor its checkpoints hold one).
"""
from __future__ import annotations

import os
import shutil

import pytest
import torch

pytest.importorskip("verl.protocol")
ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

from v1_driver import FakeAgentLoop, run_fit, sampler_snapshot_bytes  # noqa: E402
from v1_setup import MODES, RATIO, SHAPE, TAU, by_step, empty_tq, replay_cls, tq_cluster, v1_config  # noqa: E402,F401

from grpo_replay.integrations.verl.v1_store import STORE_TAG, is_store_key  # noqa: E402

FIELDS = ("old_log_probs", "advantages", *FakeAgentLoop.EXTRA_FIELDS)
# what an update with replay rows hands the worker: the fields verl's actor update reads (of the fake agent loop's
# rows), not its uid, prompt and agent-loop objects, rewards, rollout or recomputed log-probs, entropy or returns
REPLAY_FIELDS = sorted(["input_ids", "position_ids", "prompts", "responses", "response_mask", "loss_mask",
                        "old_log_probs", "advantages", *FakeAgentLoop.EXTRA_FIELDS])


def same(a, b) -> bool:
    """Bit-identical tensors, or dicts of them."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return torch.equal(a, b)


def spy_tq_checkpoints(monkeypatch) -> list:
    """The store keys TransferQueue lists each time verl saves its checkpoint (the async modes)."""
    seen, real = [], tq.save_checkpoint

    def save_checkpoint(*a, **k):
        seen.append([key for key in (tq.kv_list() or {}).get("train", {}) if is_store_key(key)])
        return real(*a, **k)

    monkeypatch.setattr(tq, "save_checkpoint", save_checkpoint)
    return seen


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", MODES)
def test_v1_replay_rows_reach_the_loss_as_stored(tq_cluster, tmp_path, mode, monkeypatch):
    empty_tq()
    tq_saves = spy_tq_checkpoints(monkeypatch)
    # extras: router replay, distillation and multi-modal fields on every row, carried with the stored row
    t = run_fit(replay_cls(mode), v1_config(tmp_path, mode, *RATIO, "replay.filter_zero_variance=false",
                                            "trainer.max_actor_ckpt_to_keep=1"), extras=True)
    n_fresh, k_steps, n_warm = SHAPE[mode]
    steps = by_step(t)
    assert sorted(steps) == list(range(1, 7))
    born = {(u["step"], k): u["rows"][k] for us in steps.values() for u in us for k in u["keys"]}
    seen_replay = 0
    for step, us in steps.items():
        m = t.step_metrics[step]
        for up in us:
            fresh = [k for k in up["keys"] if not is_store_key(k)]
            replay = [(k, tag) for k, tag in zip(up["keys"], up["tags"]) if is_store_key(k)]
            assert len(fresh) == n_fresh  # the whole fresh batch is kept (no zero-variance filter here)
            assert len(set(up["keys"])) == len(up["keys"])
            assert up["mini_batch_size"] * k_steps == len(up["keys"])  # K optimizer steps, as without replay
            if len(us) == 1:
                # the tally's share: float32, as every trainer's (no padding rows here: every key is a real row)
                assert m["replay/count"] == len(replay)
                assert m["replay/share"] == pytest.approx(len(replay) / len(up["keys"]), rel=1e-6)
            if step >= 2:  # warm: round(0.5 * fresh) replay rows, a multiple of the unit already
                assert len(replay) == n_warm, (step, len(replay), m.get("buffer/size"))
            for k, tag in replay:
                st = tag[STORE_TAG]
                assert 1 <= step - st["birth"] <= TAU and st["step"] < step
                assert set(up["rows"][k]) == set(FIELDS)
                for f in FIELDS:
                    assert same(up["rows"][k][f], born[(st["step"], st["of"])][f]), (step, k, f)
                seen_replay += 1
            if replay:  # fresh and replay rows alike: the fields the update reads
                assert up["fields"] == REPLAY_FIELDS, (step, up["fields"])
        assert "training/off_policy/trajectory_staleness/mean" in m
        assert m["perf/total_num_tokens"] == sum(tg["seq_len"] for up in us for tg in up["tags"])
        if step >= 2:
            assert m["replay/age_versions_max"] >= 1
    assert seen_replay >= 5 * n_warm * len(steps[6])
    # which log-probs a stored row keeps: the old_log_probs verl computed when the row was fresh, i.e. under the
    # version that consumed it (global step - 1). They equal the rollout's own log-probs exactly when that is the
    # version that generated it (birth - 1): always in sync mode; in colocate_async only for rows generated and
    # consumed before the first update (the warm-up batch is generated one version ahead of its consumption).
    replayed = [(up["rows"][k], tag[STORE_TAG]) for us in steps.values() for up in us
                for k, tag in zip(up["keys"], up["tags"]) if is_store_key(k)]
    for r, st in replayed:
        rollout = t.agent_loop.rollout_log_probs[st["of"]]
        assert torch.equal(r["old_log_probs"], rollout) == (st["step"] == st["birth"])
    assert any(st["step"] != st["birth"] for _, st in replayed) == (mode != "sync")
    # max_actor_ckpt_to_keep=1: only the newest step folder keeps the buffer and its stored rows
    old, new = tmp_path / "ckpt" / "global_step_3", tmp_path / "ckpt" / "global_step_6"
    assert not list(old.glob("replay_*")) and (old / "data.pt").exists()
    assert (new / "replay_buffer.store.json").exists() and (new / "replay_buffer.rows.pt").exists()
    # verl's own TransferQueue checkpoints (async modes) were written when no stored row was in TransferQueue
    assert tq_saves == ([[], []] if mode != "sync" else []), tq_saves
    # where the stored rows live: scalars in this process, the rows in the row store's actor; none in
    # TransferQueue, so verl's sampler (it lists every key of every partition on each poll) never copies one
    assert not [k for k in tq.kv_list("train")["train"] if is_store_key(k)]
    assert t.replay_store.rows.ids().tolist() == sorted(t.replay_store.live_ids().tolist())  # a row per buffer row
    st = t.replay_store.buffer.storage
    assert set(st.arena_widths().values()) == {0}  # payload-free: no token arena holds anything
    with_rows, _ = sampler_snapshot_bytes(t.replay_buffer)
    n = len(t.replay_store.buffer)
    print(f"bytes per stored row in the trainer process: {st.nbytes() / st.slots:.0f} (buffer arenas + columns; "
          f"verl's sampler keeps {with_rows} B for the whole poll, no stored key in it); in the row store: "
          f"{t.replay_store.rows.nbytes() / n:.0f} B of encoded tensors ({n} rows, this toy row)")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", MODES)
def test_v1_grpo_preset_trains_as_plain_verl(tq_cluster, tmp_path, mode):
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    empty_tq()
    plain = run_fit(TRAINER_REGISTRY[mode], v1_config(tmp_path / "plain", mode))
    empty_tq()
    grpo_cfg = v1_config(tmp_path / "grpo", mode, "replay=grpo", "replay.filter_zero_variance=false")
    grpo = run_fit(replay_cls(mode), grpo_cfg)
    for a, b in zip(plain.actor_rollout_wg.updates, grpo.actor_rollout_wg.updates, strict=True):
        assert a["mini_batch_size"] == b["mini_batch_size"] and len(a["keys"]) == len(b["keys"])
        for ka, kb in zip(a["keys"], b["keys"], strict=True):
            for f in ("old_log_probs", "advantages"):
                assert torch.equal(a["rows"][ka][f], b["rows"][kb][f])
    assert torch.equal(plain.model.table, grpo.model.table)
    assert not any(is_store_key(k) for u in grpo.actor_rollout_wg.updates for k in u["keys"])
    listed = (tq.kv_list("train") or {}).get("train", {})
    assert not [k for k in listed if is_store_key(k)]  # replay off: nothing is stored anywhere
    assert len(grpo.replay_store.rows.ids()) == 0 and type(grpo.replay_store.rows).__name__ == "RowStore"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", MODES)
def test_v1_checkpoint_resume_continues_the_same_draws(tq_cluster, tmp_path, mode, monkeypatch):
    from grpo_replay.config import ReplayConfig

    empty_tq()
    resolved, real = [], ReplayConfig.from_preset  # each resolution of the replay group builds one
    monkeypatch.setattr(ReplayConfig, "from_preset", classmethod(lambda cls, *a, **k: resolved.append(a) or real(*a, **k)))
    full = run_fit(replay_cls(mode), v1_config(tmp_path, mode, *RATIO))
    assert len(resolved) == 1  # when the trainer was built: no step resolves the settings again
    monkeypatch.undo()
    folder = tmp_path / "ckpt" / "global_step_3"
    assert (folder / "replay_buffer.npz").exists() and (folder / "replay_buffer.rows.pt").exists()
    keep = tmp_path / "copy" / "global_step_3"
    shutil.copytree(folder, keep)
    empty_tq()
    resumed = run_fit(replay_cls(mode), v1_config(tmp_path, mode, *RATIO, "trainer.resume_mode=resume_path",
                                                  f"trainer.resume_from_path={folder}"),
                      uid_start=full.names_used[3])
    a, b = by_step(full), by_step(resumed)
    assert sorted(b) == [4, 5, 6]
    n_replayed = 0
    for step in (4, 5, 6):
        for ua, ub in zip(a[step], b[step], strict=True):
            ra = [k for k in ua["keys"] if is_store_key(k)]
            rb = [k for k in ub["keys"] if is_store_key(k)]
            assert sorted(ra) == sorted(rb), step
            n_replayed += len(ra)
            for k in ra:
                assert torch.equal(ua["rows"][k]["old_log_probs"], ub["rows"][k]["old_log_probs"])
    assert n_replayed > 0
    assert torch.equal(full.model.table, resumed.model.table)

    rows = (keep / "replay_buffer.rows.pt").read_bytes()  # a damaged row file: named, before any step
    (keep / "replay_buffer.rows.pt").write_bytes(rows[: len(rows) // 3])
    empty_tq()
    with pytest.raises(ValueError, match=r"replay_buffer\.rows\.pt: not a readable replay row file"):
        run_fit(replay_cls(mode), v1_config(tmp_path / "damaged", mode, *RATIO, "trainer.resume_mode=resume_path",
                                            f"trainer.resume_from_path={keep}"))
    (keep / "replay_buffer.rows.pt").write_bytes(rows)
    layout = (keep / "replay_buffer.store.json").read_text()  # as a version that kept them in TransferQueue wrote it
    (keep / "replay_buffer.store.json").write_text('{"key_prefix": "grpo-replay-", "id": "buffer_seq"}')
    empty_tq()
    with pytest.raises(ValueError, match=r"keeps its stored rows in TransferQueue.*allow_empty_resume"):
        run_fit(replay_cls(mode), v1_config(tmp_path / "older", mode, *RATIO, "trainer.resume_mode=resume_path",
                                            f"trainer.resume_from_path={keep}"))
    (keep / "replay_buffer.store.json").write_text(layout)
    os.remove(keep / "replay_buffer.npz")
    empty_tq()
    with pytest.raises(FileNotFoundError, match=r"replay_buffer\.npz.*allow_empty_resume"):
        run_fit(replay_cls(mode), v1_config(tmp_path, mode, *RATIO, "trainer.resume_mode=resume_path",
                                        f"trainer.resume_from_path={keep}"))
    empty_tq()
    empty = run_fit(replay_cls(mode), v1_config(tmp_path / "empty", mode, *RATIO, "trainer.resume_mode=resume_path",
                                                f"trainer.resume_from_path={keep}", "replay.allow_empty_resume=true"),
                    uid_start=full.names_used[3])
    first = by_step(empty)[4]
    assert not any(is_store_key(k) for u in first for k in u["keys"])  # the buffer starts empty ...
    # ... and holds only the rows stored since, each in the row store, none in TransferQueue
    assert empty.replay_store.rows.ids().tolist() == sorted(empty.replay_store.live_ids().tolist())
    assert len(empty.replay_store.buffer) > 0
    assert not [k for k in tq.kv_list("train")["train"] if is_store_key(k)]


@pytest.mark.timeout(900)
def test_v1_max_uses_replays_each_stored_row_once_and_drops_it_after_the_update(tq_cluster, tmp_path):
    empty_tq()
    t = run_fit(replay_cls("sync"), v1_config(tmp_path, "sync", *RATIO, "replay.filter_zero_variance=false",
                                              "replay.max_uses=1", "replay.tau_max=5"))
    replayed = [k for us in by_step(t).values() for up in us for k in up["keys"] if is_store_key(k)]
    assert replayed and len(replayed) == len(set(replayed))  # read for its update, then evicted: never again
    assert t.replay_store.buffer.total_evicted_uses >= len(replayed)
    held = {f"grpo-replay-{i}" for i in t.replay_store.rows.ids()}
    assert not held & set(replayed)  # the evicted rows left the row store
    assert len(held) == len(t.replay_store.buffer)
    assert not [k for k in tq.kv_list("train")["train"] if is_store_key(k)]  # and each replay copy was cleared
