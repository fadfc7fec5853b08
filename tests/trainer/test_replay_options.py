"""The options beyond the paper (replay.max_drift, fill_filtered, max_uses, age_decay) acting in short real
runs of the built-in trainer on the tiny testbed."""
import json

import pytest

from grpo_replay.cli import main
from helpers import train_metrics


def test_max_uses_evicts_rows_replayed_that_often(tiny_overrides, tmp_path):
    rows = train_metrics(tiny_overrides, tmp_path / "r", **{"replay.max_uses": 1})
    assert rows[-1]["buffer/evicted_uses"] > 0
    # replay/inserted (as TRL and verl log it): every update's fresh rows enter the buffer after it
    assert [r["replay/inserted"] for r in rows] == [r["fresh/count"] if r["loss"] is not None else 0 for r in rows]
    # max_uses=1: every replayed row leaves the buffer after its draw, so evictions add up to the rows replayed
    assert rows[-1]["buffer/evicted_uses"] == sum(r["replay/count"] for r in rows)


def test_fill_filtered_replays_what_the_filter_removed(tiny_overrides, tmp_path):
    rows = train_metrics(tiny_overrides, tmp_path / "r", **{"replay.fill_filtered": True})
    n = tiny_overrides["prompts_per_step"] * tiny_overrides["group_size"]
    warm = tiny_overrides["replay.warmup_steps"]
    assert all(r["replay/count"] == 0 for r in rows[:warm])
    after = rows[warm:]
    for prev, r in zip(rows[warm - 1 :], after):  # no age eviction within these steps (tau_max = 10)
        assert r["replay/count"] == min(n - r["fresh/count"], prev["buffer/size"])
    assert any(r["update_rows"] == n for r in after)


def test_max_drift_masks_and_evicts_drifted_replay_rows(tiny_overrides, tmp_path):
    rows = train_metrics(tiny_overrides, tmp_path / "r", **{"replay.max_drift": 1e-9})
    measured = [r for r in rows if r["replay/drift_dropped"]]
    assert measured and all(0 <= r["replay/drift_mean"] <= r["replay/drift_max"] for r in measured)
    running = 0
    for r in rows:
        running += r["replay/drift_dropped"]
        assert r["buffer/evicted_drift"] == running
    # Every replayed row drifted past 1e-9: none reached the loss, so the counts, the share, the update rows (compare's
    # row-pass budget) and the replay ratio and clip statistics hold the fresh rows only, as --backend trl's do.
    for r in rows:
        assert r["replay/count"] == 0 and r["replay/share"] == 0.0 and r["update_rows"] == r["fresh/count"]
        assert "replay/ratio_mean" not in r and "replay/age_mean" not in r


def test_age_decay_draws_younger_rows(tiny_overrides, tmp_path):
    base = train_metrics(tiny_overrides, tmp_path / "a", steps=8)
    decayed = train_metrics(tiny_overrides, tmp_path / "b", steps=8, **{"replay.age_decay": 0.05})
    mean_age = lambda rows: sum(r["replay/age_mean"] * r["replay/count"] for r in rows if r["replay/count"]) / sum(  # noqa: E731
        r["replay/count"] for r in rows)
    assert mean_age(decayed) < mean_age(base)


def test_trl_backend_applies_max_drift(tiny_overrides, tmp_path):
    pytest.importorskip("trl")
    rows = train_metrics({**tiny_overrides, "backend": "trl"}, tmp_path / "r", steps=3,
                         **{"replay.max_drift": 1e-12, "replay.warmup_steps": 1})
    dropped = [r["replay/drift_dropped"] for r in rows]
    assert dropped[0] == 0 and all(d > 0 for d in dropped[1:])  # every replayed row drifted past 1e-12
    assert rows[-1]["buffer/evicted_drift"] == sum(dropped) and all(r["replay/count"] == 0 for r in rows)


def test_trl_backend_fills_filtered_rows_and_evicts_used_ones(tiny_overrides, tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "trl"
    sets = {**tiny_overrides, "steps": 4, "replay.warmup_steps": 1, "replay.fill_filtered": True, "replay.max_uses": 1,
            "replay.age_decay": 2.0, "replay.tau_max": 10}
    argv = ["train", "--out", str(out), "--no-progress", "--backend", "trl"]
    for k, v in sets.items():
        if k != "progress":
            argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    assert main(argv) == 0
    hist = json.loads((out / "trl_summary.json").read_text())["replay_history"]
    assert len(hist) == 4 and hist[0]["replay_rows"] == 0  # warm-up step
    n = tiny_overrides["prompts_per_step"] * tiny_overrides["group_size"]
    logged = [r["buffer/evicted_uses"] for r in json.loads((out / "trl_summary.json").read_text())["log_history"]
              if "buffer/evicted_uses" in r]
    # max_uses=1: every replayed row leaves the buffer after its draw
    assert logged and logged[-1] == sum(h["replay_rows"] for h in hist) > 0
    # metrics.jsonl (what compare's evicted-by-uses column and the reports read) has them too, as integers
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["buffer/evicted_uses"] for r in rows] == logged
    assert all(isinstance(r["buffer/evicted_age"], int) for r in rows)
    assert [r["replay/inserted"] for r in rows] == [h["inserted"] for h in hist]
    zero_var = [n - sum(1 for a in h["fresh_advantages"] if a != 0) for h in hist]
    for prev, h, z in zip(hist, hist[1:], zero_var[1:]):  # one process, steps_per_generation 1: nothing trimmed
        assert h["fresh_rows"] == n and h["replay_rows"] == min(z, prev["buffer_size"])


@pytest.mark.parametrize("setting,message", [
    ("replay.max_drift=0", "ReplayConfig.max_drift=0.0 is invalid; allowed: a finite number > 0 or None"),
    ("replay.max_uses=0", "ReplayConfig.max_uses=0 is invalid; allowed: an integer >= 1 or None"),
    ("replay.age_decay=-2", "ReplayConfig.age_decay=-2.0 is invalid; allowed: a finite number > 0 or None"),
    ("replay.fill_filtered=1", "replay.fill_filtered=1 has the wrong type"),
])
def test_bad_option_values_exit_2_before_any_compute(tmp_path, capsys, setting, message):
    out = tmp_path / "r"
    assert main(["train", "--out", str(out), "--no-progress", "--set", setting]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_fill_filtered_with_pool_exits_2(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", "--out", str(out), "--no-progress", "--preset", "sigma_pool", "--set", "replay.fill_filtered=true"]) == 2
    assert "ReplayConfig.fill_filtered=True is invalid; allowed: false with composition='pool'" in capsys.readouterr().err
    assert not out.exists()


def test_a_resumed_run_with_every_option_on_matches_an_uninterrupted_one(tiny_overrides, tmp_path):
    from helpers import without_times

    opts = {"replay.max_uses": 2, "replay.max_drift": 1e-4, "replay.age_decay": 2.0, "replay.fill_filtered": True}
    whole = train_metrics(tiny_overrides, tmp_path / "a", **opts)
    train_metrics(tiny_overrides, tmp_path / "b", **opts, steps=3)
    resumed = train_metrics(tiny_overrides, tmp_path / "b", **opts)
    assert without_times(resumed) == without_times(whole)
    assert whole[-1]["buffer/evicted_uses"] > 0 and whole[-1]["buffer/evicted_drift"] > 0
