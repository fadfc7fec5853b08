"""The policy-drift diagnostic: drift/kl_1 and drift/kl_tau on a fixed probe, through real `train()`
runs on the tiny testbed, and its pieces."""
import math

import pytest
import torch

import grpo_replay.trainer.loop as loop
from grpo_replay.errors import ConfigError
from grpo_replay.trainer import checkpoint
from grpo_replay.trainer.train_config import resolve
from grpo_replay.trainer.drift import DriftProbe, kl_mean, lags_for
from helpers import read_jsonl, without_times

TAU = 3
KEYS = ("drift/kl_1", "drift/kl_tau")


def _cfg(tiny_overrides, out, **extra):
    return resolve({**tiny_overrides, "out_dir": str(out), "replay.tau_max": TAU, "eval_every": 0, **extra})


def _no_drift(rows):
    return [{k: v for k, v in r.items() if not k.startswith("drift/")} for r in without_times(rows)]


@pytest.fixture(scope="module")
def drift_run(tiny_overrides, tmp_path_factory):
    out = tmp_path_factory.mktemp("drift") / "run"
    loop.train(_cfg(tiny_overrides, out, drift_probe=16))
    return out


def test_train_logs_drift_finite_non_negative_beside_replay(drift_run):
    rows = read_jsonl(drift_run / "metrics.jsonl")
    assert len(rows) == 6
    for i, r in enumerate(rows):  # row i is step t = i: pi_t against pi_{t-1} and pi_{t-TAU}
        for key, k in zip(KEYS, (1, TAU)):
            if i < k:
                assert r[key] is None, (i, key)  # no policy k steps back yet
            else:
                assert math.isfinite(r[key]) and r[key] >= 0, (i, key, r[key])
        assert r["time/drift_s"] >= 0
        if r["loss"] is not None and r["replay/count"]:  # an update with replayed rows: their clip fraction and ratio
            assert "replay/clip_frac" in r and "replay/ratio_mean" in r
    assert any(r["loss"] is not None and r["replay/count"] for r in rows)  # replay took part in this run
    assert any(r["drift/kl_1"] for r in rows[1:])  # the policy moved (lr 3e-3)
    assert (drift_run / "drift.png").is_file()
    assert (checkpoint.latest(drift_run) / checkpoint.DRIFT).is_file()


def test_drift_does_not_change_the_run(drift_run, tiny_overrides, tmp_path):
    out = tmp_path / "off"
    loop.train(_cfg(tiny_overrides, out))
    off = read_jsonl(out / "metrics.jsonl")
    assert not any(k.startswith("drift/") for r in off for k in r)
    assert _no_drift(read_jsonl(drift_run / "metrics.jsonl")) == without_times(off)
    assert read_jsonl(drift_run / "evals.jsonl") == read_jsonl(out / "evals.jsonl")


def test_resumed_run_logs_the_same_drift(drift_run, tiny_overrides, tmp_path):
    out = tmp_path / "resumed"
    loop.train(_cfg(tiny_overrides, out, drift_probe=16, steps=4))  # checkpoint at 4 holds pi_1..pi_3's log-probs
    loop.train(_cfg(tiny_overrides, out, drift_probe=16))  # resumes at step 4: kl_tau needs pi_1 from the checkpoint
    resumed, full = read_jsonl(out / "metrics.jsonl"), read_jsonl(drift_run / "metrics.jsonl")
    assert without_times(resumed) == without_times(full)
    assert resumed[4]["drift/kl_tau"] is not None


def test_drift_is_zero_when_the_policy_does_not_move(tiny_overrides, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, closure=None: None)  # updates computed, never applied
    out = tmp_path / "still"
    loop.train(_cfg(tiny_overrides, out, drift_probe=8, steps=4, **{"replay.tau_max": 2}))
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["drift/kl_1"] for r in rows] == [None, 0.0, 0.0, 0.0]
    assert [r["drift/kl_tau"] for r in rows] == [None, None, 0.0, 0.0]


def test_kl_mean_exact():
    p = torch.tensor([0.5, 0.25, 0.25]).log()
    q = torch.tensor([0.25, 0.5, 0.25]).log()
    logp = torch.stack([p, p]).unsqueeze(0)  # (1, 2, 3)
    logq = torch.stack([q, p]).unsqueeze(0)
    mask = torch.tensor([[True, False]])
    want = 0.5 * math.log(2) + 0.25 * math.log(0.5)  # KL(p || q), position 2 masked out
    assert kl_mean(logp, logq, mask) == pytest.approx(want, rel=1e-6)
    assert kl_mean(logp, logp, torch.ones(1, 2, dtype=torch.bool)) == 0.0
    assert kl_mean(logp, logq, torch.zeros(1, 2, dtype=torch.bool)) == 0.0


def test_lags_history_and_memory_guard():
    assert lags_for(10) == {"1": 1, "tau": 10} and lags_for(None) == {"1": 1} and lags_for(0) == {"1": 1}
    rows = {"prompt_ids": torch.ones(4, 3, dtype=torch.long), "prompt_mask": torch.ones(4, 3, dtype=torch.long),
            "completion_ids": torch.ones(4, 5, dtype=torch.long), "completion_mask": torch.ones(4, 5, dtype=torch.long)}
    probe = DriftProbe(rows, lags_for(3))
    assert probe.keep == 3 and probe.bytes_per_step(22) == 4 * 5 * 22 * 4
    probe.check_memory(22)
    with pytest.raises(ValueError, match=r"TrainConfig.drift_probe=4 .*allowed: a smaller drift_probe, or 0"):
        probe.check_memory(50_000_000)
    probe.history = {s: torch.zeros(1) for s in range(5)}
    state = probe.state_dict()
    other = DriftProbe({k: torch.zeros_like(v) for k, v in rows.items()}, lags_for(3))
    other.load_state_dict(state)
    assert sorted(other.history) == list(range(5)) and torch.equal(other.rows["completion_ids"], rows["completion_ids"])


def test_drift_probe_validation(tiny_overrides):
    with pytest.raises(ConfigError, match=r"TrainConfig.drift_probe=-1 is invalid; allowed: an integer >= 0 \(0 = off\)"):
        resolve({"drift_probe": -1})
    with pytest.raises(ConfigError, match=r"TrainConfig.drift_probe=8 is invalid; allowed: 0 with backend='trl'"):
        resolve({"drift_probe": 8, "backend": "trl"})
