"""Replay on batches verl pads, through verl 0.9.1's real v1 `fit()` on CPU (v1_driver.py says what is faked).

verl's `_balance_batch` appends synthetic rows (tag `is_padding`, `response_mask` 0) whenever the sampled batch is
not a multiple of its worker unit: agent loops that emit several outputs per session (keys `{uid}_{s}_{i}`,
i > 0) and failed groups (sync mode keeps a failed prompt's trajectories and pads for the missing ones) are the
ordinary cases. Replay must act on those batches with its invariants: every real fresh row kept, replay rows
bit-identical to their fresh selves, ages in [1, tau_max], the optimizer-step count kept.
"""
from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("verl.protocol")
ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

from v1_driver import run_fit  # noqa: E402
from v1_setup import MODES, RATIO, ROLLOUT_N, TAU, by_step, empty_tq, replay_cls, tq_cluster, v1_config  # noqa: E402,F401

from grpo_replay.integrations.verl.v1_store import STORE_TAG, is_store_key  # noqa: E402

MB = 2 * ROLLOUT_N  # actor.ppo_mini_batch_size=2 prompts
CASES = [(m, "multi_output") for m in MODES] + [("sync", "fail")]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode,agent", CASES)
def test_v1_replay_acts_on_batches_verl_pads(tq_cluster, tmp_path, mode, agent):
    empty_tq()
    t = run_fit(replay_cls(mode), v1_config(tmp_path, mode, *RATIO, "replay.filter_zero_variance=false"),
                **{agent: True})
    steps = by_step(t)
    assert sorted(steps) == list(range(1, 7))
    born = {(u["step"], k): u["rows"][k] for us in steps.values() for u in us for k in u["keys"]}
    padded_steps = n_replay = 0
    for step, us in steps.items():
        m = t.step_metrics[step]
        assert "replay/count" in m  # replay is on at every step, padded or not
        for up in us:
            real = [k for k, tag in zip(up["keys"], up["tags"]) if not is_store_key(k) and not tag.get("is_padding")]
            pads = [k for k, tag in zip(up["keys"], up["tags"]) if tag.get("is_padding")]
            replay = [(k, tag) for k, tag in zip(up["keys"], up["tags"]) if is_store_key(k)]
            # every real fresh row of every sampled group is trained on: whole sessions, extra outputs included
            sessions = {}
            for k in real:
                uid, s, i = k.rsplit("_", 2)
                sessions.setdefault(uid, set()).add((int(s), int(i)))
            for uid, got in sessions.items():
                ss = {s for s, _ in got}
                assert ss == set(range(ROLLOUT_N)) or (agent == "fail" and ss == set(range(ROLLOUT_N - 1))), got
                if agent == "multi_output":
                    assert all((s, 0) in got for s in ss)
            padded_steps += len(real) % MB != 0  # verl had to pad this batch (its unit: lcm(dp, mini-batch) = 8 rows)
            # as many optimizer steps as verl's own padded batch has mini-batches
            assert len(up["keys"]) == up["mini_batch_size"] * math.ceil(len(real) / MB)
            assert len(set(up["keys"])) == len(up["keys"])
            assert m["replay/padding_rows"] == len(pads) or len(us) > 1
            if step >= 2:
                assert replay, (step, len(real), len(pads))
            for k, tag in replay:
                st = tag[STORE_TAG]
                assert 1 <= step - st["birth"] <= TAU and st["step"] < step
                for f in ("old_log_probs", "advantages"):
                    assert torch.equal(up["rows"][k][f], born[(st["step"], st["of"])][f]), (step, k, f)
            n_replay += len(replay)
    assert padded_steps >= 3
    assert n_replay >= 5  # one per warm update at least
    # stored rows are real rows only: verl's synthetic padding rows never enter the buffer
    ids = t.replay_store.rows.ids().tolist()
    _, tags = t.replay_store.rows.get(ids)
    pad_keys = {k for us in steps.values() for u in us for k, tag in zip(u["keys"], u["tags"]) if tag.get("is_padding")}
    assert ids and pad_keys and not {tag[STORE_TAG]["of"] for tag in tags} & pad_keys
    assert len(ids) == len(t.replay_store.buffer)
    assert not [k for k in tq.kv_list("train")["train"] if is_store_key(k)]
