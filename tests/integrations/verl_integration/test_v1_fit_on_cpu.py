"""Replay through verl 0.9.1's real v1 `fit()` loop, sync mode, on CPU (v1_driver.py says what is faked).

One Ray cluster (4 CPUs) and one TransferQueue (2 storage units) for the module; each run gets a TransferQueue
emptied first, as a fresh process would have. Checked at the loss (the fake actor records every row it trains on):
replay rows' old log-probs / advantages / rollout log-probs are bit-identical to what the same row carried at its
birth step, ages lie in [1, tau_max] versions, the replay share is as configured once warm, `replay=grpo` trains
exactly as verl's own `PPOTrainerSync`, and a resume from a mid-run checkpoint continues the same draws.
"""
from __future__ import annotations

import os
import shutil

import pytest
import torch

pytest.importorskip("verl.protocol")
ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

from hydra import compose, initialize_config_module  # noqa: E402
from v1_driver import run_fit, write_dataset  # noqa: E402

from grpo_replay.integrations.verl.v1_store import STORE_TAG, is_store_key, tq_row_nbytes  # noqa: E402

ROLLOUT_N, PROMPTS, TAU = 4, 4, 2
RATIO = ("replay.replay_ratio=0.5",)


@pytest.fixture(scope="module")
def tq_cluster():
    src = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "src"))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    from omegaconf import OmegaConf

    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 2}}}))
    yield
    tq.close()
    ray.shutdown()


def empty_tq():
    for pid, items in (tq.kv_list() or {}).items():
        if items:
            tq.kv_clear(keys=list(items), partition_id=pid)


def v1_config(tmp_path, mode, *overrides):
    os.makedirs(tmp_path, exist_ok=True)
    data = str(tmp_path / "data.parquet")
    if not os.path.exists(data):
        write_dataset(data)
    with initialize_config_module(config_module="grpo_replay.integrations.verl.config", version_base=None):
        cfg = compose(
            config_name="replay_ppo_trainer",
            overrides=[
                f"data.train_files=[{data}]", f"data.val_files=[{data}]", f"data.train_batch_size={PROMPTS}",
                "data.max_prompt_length=32", "data.max_response_length=6", "data.dataloader_num_workers=0",
                f"actor_rollout_ref.rollout.n={ROLLOUT_N}", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.model.path=/nonexistent",
                "algorithm.adv_estimator=grpo", "trainer.total_training_steps=6", "trainer.save_freq=3",
                "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[console]",
                f"trainer.default_local_dir={tmp_path}/ckpt", "trainer.resume_mode=disable",
                "trainer.n_gpus_per_node=2",
                "replay.warmup_steps=0", f"replay.tau_max={TAU}", f"trainer.v1.trainer_mode={mode}",
                *(SEPARATE if mode == "separate_async" else []),
                *overrides,
            ],
        )
    cfg.transfer_queue.enable = True
    return cfg


def replay_cls(mode):
    from grpo_replay.integrations.verl.trainer_v1 import replay_trainer_cls

    return replay_trainer_cls(mode)


MODES = ["sync", "colocate_async", "separate_async"]
# per mode: fresh rows per actor update, optimizer steps per update (K), replay rows per update once warm
SHAPE = {"sync": (16, 2, 8), "colocate_async": (16, 2, 8), "separate_async": (8, 1, 4)}
SEPARATE = [  # train_batch_size = parameter_sync_step * ppo_mini_batch_size; standalone rollout only
    "trainer.v1.separate_async.parameter_sync_step=2", "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]


def by_step(trainer):
    """{global step: [its actor updates]} (separate_async: parameter_sync_step updates per step)."""
    out = {}
    for u in trainer.actor_rollout_wg.updates:
        out.setdefault(u["step"], []).append(u)
    return out


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", MODES)
def test_v1_replay_rows_reach_the_loss_as_stored(tq_cluster, tmp_path, mode):
    empty_tq()
    t = run_fit(replay_cls(mode), v1_config(tmp_path, mode, *RATIO, "replay.filter_zero_variance=false",
                                            "trainer.max_actor_ckpt_to_keep=1"))
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
                assert m["replay/replay_rows"] == len(replay) and m["replay/share"] == len(replay) / len(up["keys"])
            if step >= 2:  # warm: round(0.5 * fresh) replay rows, a multiple of the unit already
                assert len(replay) == n_warm, (step, len(replay), m.get("buffer/size"))
            for k, tag in replay:
                st = tag[STORE_TAG]
                assert 1 <= step - st["birth"] <= TAU and st["step"] < step
                for f in ("old_log_probs", "advantages", "rollout_log_probs"):
                    assert torch.equal(up["rows"][k][f], born[(st["step"], st["of"])][f]), (step, k, f)
                seen_replay += 1
            assert up["fields"] == steps[1][0]["fields"]  # replay rows carry exactly the fresh rows' fields
        assert "training/off_policy/trajectory_staleness/mean" in m
        assert m["perf/total_num_tokens"] == sum(tg["seq_len"] for up in us for tg in up["tags"])
        if step >= 2:
            assert m["replay/age_versions/max"] >= 1
    assert seen_replay >= 5 * n_warm * len(steps[6])
    # which log-probs a stored row keeps: the old_log_probs verl computed when the row was fresh, i.e. under the
    # version that consumed it (global step - 1). They equal the rollout's own log-probs exactly when that is the
    # version that generated it (birth - 1): always in sync mode; in colocate_async only for rows generated and
    # consumed before the first update (the warm-up batch is generated one version ahead of its consumption).
    replayed = [(up["rows"][k], tag[STORE_TAG]) for us in steps.values() for up in us
                for k, tag in zip(up["keys"], up["tags"]) if is_store_key(k)]
    for r, st in replayed:
        assert torch.equal(r["old_log_probs"], r["rollout_log_probs"]) == (st["step"] == st["birth"])
    assert any(st["step"] != st["birth"] for _, st in replayed) == (mode != "sync")
    # max_actor_ckpt_to_keep=1: only the newest step folder keeps the buffer and (sync) its rows
    old, new = tmp_path / "ckpt" / "global_step_3", tmp_path / "ckpt" / "global_step_6"
    assert not list(old.glob("replay_*")) and (new / "replay_buffer.store.json").exists()
    assert (new / "replay_transfer_queue").exists() == (mode == "sync")
    # where the stored rows live: scalars in this process, token tensors in TransferQueue's storage units
    listed = tq.kv_list("train")["train"]
    stored = [k for k in listed if is_store_key(k)]
    assert len(stored) == len(t.replay_store.buffer)
    row = tq.kv_batch_get(keys=stored[:1], partition_id="train")
    st = t.replay_store.buffer.storage
    print(f"bytes per stored row slot in the trainer process: {st.nbytes() / st.slots:.0f} (arenas + columns); "
          f"in TransferQueue: {tq_row_nbytes(row)} of tensor fields (this toy row)")


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
    assert not [k for k in listed if is_store_key(k)]  # replay off: no row is copied into TransferQueue


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", MODES)
def test_v1_checkpoint_resume_continues_the_same_draws(tq_cluster, tmp_path, mode):
    empty_tq()
    full = run_fit(replay_cls(mode), v1_config(tmp_path, mode, *RATIO))
    folder = tmp_path / "ckpt" / "global_step_3"
    # sync: verl saves no TransferQueue state, the stored rows go to replay_transfer_queue/; async: verl's own
    tq_dir = "replay_transfer_queue" if mode == "sync" else "transfer_queue"
    assert (folder / "replay_buffer.npz").exists() and (folder / tq_dir).exists()
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
    # ... and the stored rows restored with verl's TransferQueue checkpoint (async modes) were cleared, not leaked
    live = {f"grpo-replay-{i}" for i in empty.replay_store.live_ids()}
    assert {k for k in tq.kv_list("train")["train"] if is_store_key(k)} == live


@pytest.mark.timeout(900)
def test_v1_max_uses_replays_each_stored_row_once_and_clears_it_after_the_update(tq_cluster, tmp_path):
    empty_tq()
    t = run_fit(replay_cls("sync"), v1_config(tmp_path, "sync", *RATIO, "replay.filter_zero_variance=false",
                                              "replay.max_uses=1", "replay.tau_max=5"))
    replayed = [k for us in by_step(t).values() for up in us for k in up["keys"] if is_store_key(k)]
    assert replayed and len(replayed) == len(set(replayed))  # read for its update, then evicted: never again
    assert t.replay_store.buffer.total_evicted_uses >= len(replayed)
    listed = tq.kv_list("train")["train"]
    assert sorted(k for k in listed if is_store_key(k)) == sorted(
        k for k in listed if is_store_key(k) and k not in set(replayed))  # the evicted rows' keys are cleared
    assert len([k for k in listed if is_store_key(k)]) == len(t.replay_store.buffer)
