"""The paired view of a comparison: paired curves, rollouts to reach GRPO's final accuracy, cost and drift regime."""
import json

import pytest

from grpo_replay.cli import main
from grpo_replay.experiments import paired_view
from grpo_replay.experiments.stats import Run


def _run(arm, seed, accs, per_eval=100):
    evals = [{"generated": i * per_eval, "acc_sampled": a, "acc_greedy": a, "n_samples": 1, "counts": [0]}
             for i, a in enumerate(accs)]
    return Run(arm, seed, evals, update_rows=0, generated=(len(accs) - 1) * per_eval)


def test_paired_curve_is_the_ci_of_same_seed_differences():
    base = {0: _run("grpo", 0, [0.1, 0.2, 0.3]), 1: _run("grpo", 1, [0.1, 0.4, 0.5])}
    arm = [_run("a", 0, [0.1, 0.3, 0.35]), _run("a", 1, [0.1, 0.45, 0.6])]
    curve = paired_view.paired_curve(arm, base, [0.0, 100.0, 150.0, 200.0])
    assert curve[0]["mean"] == pytest.approx(0.0)
    assert curve[1]["mean"] == pytest.approx((0.1 + 0.05) / 2)
    assert curve[2]["mean"] == pytest.approx(((0.325 - 0.25) + (0.525 - 0.45)) / 2)  # linear between evaluations
    assert curve[3]["mean"] == pytest.approx((0.05 + 0.1) / 2) and curve[3]["n"] == 2
    assert curve[3]["lo"] < curve[3]["mean"] < curve[3]["hi"] and curve[3]["mde"] > 0
    # A point past a run's last evaluation has no value for that seed.
    assert paired_view.paired_curve(arm, base, [300.0])[0]["n"] == 0


def test_reach_ratio_uses_each_seeds_own_grpo_final_and_counts_seeds_that_never_reach_it():
    base = {0: _run("grpo", 0, [0.1, 0.2, 0.3]), 1: _run("grpo", 1, [0.1, 0.4, 0.5]), 2: _run("grpo", 2, [0.1, 0.2, 0.4])}
    arm = [_run("a", 0, [0.1, 0.3, 0.35]),   # reaches 0.3 at 100 of GRPO's 200: 0.5x
           _run("a", 1, [0.1, 0.3, 0.5]),    # reaches 0.5 at its last point: 1.0x
           _run("a", 2, [0.1, 0.2, 0.3])]    # never reaches 0.4
    r = paired_view.reach_ratio(arm, base)
    assert r["per_seed"] == {0: pytest.approx(0.5), 1: pytest.approx(1.0), 2: None}
    assert (r["reached"], r["n"], r["not_reached"], r["within_target"]) == (2, 3, [2], 1)
    assert r["ci"]["mean"] is None  # no mean over only the seeds that reached it
    assert r["median"] == pytest.approx(1.0)
    r2 = paired_view.reach_ratio(arm[:2], base)
    assert r2["ci"]["mean"] == pytest.approx(0.75) and r2["ci"]["n"] == 2
    assert paired_view.reach_ratio(arm[2:], base)["median"] is None


def test_a_seed_whose_grpo_run_did_not_improve_is_left_out_of_the_reach():
    base = {0: _run("grpo", 0, [0.3, 0.2, 0.3]), 1: _run("grpo", 1, [0.1, 0.2, 0.4])}
    r = paired_view.reach_ratio([_run("a", 0, [0.3, 0.3, 0.3]), _run("a", 1, [0.1, 0.4, 0.4])], base)
    assert r["grpo_not_improved"] == [0] and r["per_seed"] == {1: pytest.approx(0.5)} and r["n"] == 1


def test_run_regime_reads_step_means_totals_and_last_values(tmp_path):
    rows = [{"step": 1, "time/step_s": 0.6, "time/drift_s": 0.1, "drift/kl_1": 0.01, "fresh/clip_frac": 0.0},
            {"step": 2, "time/step_s": 0.25, "drift/kl_1": 0.03, "replay/clip_frac": 0.2, "replay/drift_dropped": 2,
             "buffer/evicted_uses": 4},
            {"step": 3, "time/step_s": 0.25, "replay/clip_frac": 0.1, "replay/drift_dropped": 1, "buffer/evicted_uses": 9}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    g = paired_view.run_regime(tmp_path)
    assert g["train_s"] == pytest.approx(1.0)  # the drift probe's time left out
    assert g["drift/kl_1"] == pytest.approx(0.02)
    assert g["replay/clip_frac"] == pytest.approx(0.15)
    assert g["replay/drift_dropped"] == pytest.approx(3.0)
    assert g["buffer/evicted_uses"] == pytest.approx(9.0)
    assert g["drift/kl_tau"] is None and g["replay/drift_mean"] is None


@pytest.mark.slow
def test_the_report_has_a_paired_section_and_plot(tmp_path):
    out = tmp_path / "c"
    assert main(["compare", "--quick", "--out", str(out), "--jobs", "2", "--no-progress", "--comparisons", "main",
                 "--arms", "paper"]) == 0
    rep = out / "report"
    assert (rep / "paired_main.png").stat().st_size > 0
    md = (rep / "report.md").read_text()
    assert "Paired view (each arm minus GRPO of the same seed)" in md and "![paired difference" in md
    res = json.loads((rep / "results.json").read_text())
    view = res["paired_view"]["paper"]
    # Each of the 2 seeds is counted or named as one whose GRPO run did not improve (which depends on the CPU kind).
    reach = view["reach"]
    assert reach["n"] + len(reach["grpo_not_improved"]) == 2 and len(view["paired_curve"]) == len(view["grid"])
    assert view["regime"]["train_s"]["mean"] > 0
    assert paired_view.run_regime(tmp_path)["train_s"] is None  # no metrics: no time, not 0
