"""`grpo-replay plot` reads a run recorded under a backend's old metric names by the one vocabulary."""
import json

import pytest

from grpo_replay.plotting.overlay import final_metrics, load_run


def test_a_run_with_old_verl_names_is_read_and_tabled_by_the_new_names(tmp_path):
    run = tmp_path / "old-run"
    run.mkdir()
    (run / "config.yaml").write_text("preset: paper\nseed: 3\nsteps: 2\n")
    rows = [{"step": 1, "generated": 8, "reward": 0.5, "replay/share": 0.25, "replay/fresh_rows": 6.0,
             "replay/replay_rows": 2.0, "fresh/clip_frac": 0.1, "replay/clip_frac": 0.3},
            {"step": 2, "generated": 16, "reward": 0.75, "replay/share": 0.5, "replay/fresh_rows": 4.0,
             "replay/replay_rows": 4.0, "fresh/clip_frac": 0.2, "replay/clip_frac": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "evals.jsonl").write_text(json.dumps({"step": 0, "generated": 0, "acc_sampled": 0.1, "acc_greedy": 0.2}) + "\n")
    r = load_run(run)
    assert [m["replay/count"] for m in r["metrics"]] == [2.0, 4.0] and [m["fresh/count"] for m in r["metrics"]] == [6.0, 4.0]
    r["label"] = "old"
    row = final_metrics(r)
    # the replay clip fraction is averaged over the steps that replayed: found only through replay/count
    assert row["replay_clip_frac_mean"] == pytest.approx(0.4) and row["fresh_clip_frac_mean"] == pytest.approx(0.15)
