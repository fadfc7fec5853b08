"""The alternatives comparison's measures: the three axes of a run, the best alternative without replay, and the
rollouts and training time each arm needs to reach that alternative's final accuracy."""
import json

import pytest

from grpo_replay.experiments import alternatives as alt
from grpo_replay.experiments import axis_runs


def _run(accs, seed=0, rows=10, passes=None, step_s=2.0, drift_s=0.5, per_eval=5, rollouts_per_step=100):
    """An AxisRun with evaluations every `per_eval` steps at accuracies `accs` (the first at step 0)."""
    steps = per_eval * (len(accs) - 1)
    metrics = [{"step": k, "update_rows": rows, "time/step_s": step_s, "time/drift_s": drift_s,
                **({"epochs/passes": passes} if passes else {})} for k in range(1, steps + 1)]
    evals = [{"step": i * per_eval, "generated": i * per_eval * rollouts_per_step, "acc_sampled": a} for i, a in enumerate(accs)]
    return axis_runs.run_axes(evals, metrics, seed)


def test_axes_count_every_pass_and_leave_the_drift_probe_out():
    r = _run([0.1, 0.2, 0.3], rows=10, passes=2)
    assert r.xs["generated"] == [0, 500, 1000]
    assert r.xs["row_passes"] == [0, 100, 200]  # 10 rows x 2 passes x 5 steps per evaluation
    assert r.xs["train_s"] == [0, 7.5, 15.0]  # (2.0 - 0.5) s x 5 steps
    assert _run([0.1, 0.2]).xs["row_passes"] == [0, 50]  # no epochs/passes: one pass


def test_the_best_alternative_is_the_arm_without_replay_with_the_highest_mean_final_accuracy():
    runs = {"grpo": {0: _run([0.1, 0.2]), 1: _run([0.1, 0.3])}, "grpo_mu2": {0: _run([0.1, 0.3]), 1: _run([0.1, 0.3])},
            "fill": {0: _run([0.1, 0.9]), 1: _run([0.1, 0.9])}}
    assert alt.best_alternative(runs) == "grpo_mu2"  # fill is higher but replays
    assert alt.best_alternative({"fill": runs["fill"]}) is None


def test_reach_is_where_the_curve_first_crosses_the_seed_target_relative_to_the_best_alternative():
    best = {0: _run([0.1, 0.2, 0.4], seed=0), 1: _run([0.1, 0.3, 0.3], seed=1)}
    # seed 0: target 0.4, the best reaches it at 1000 rollouts; the arm at 250 (halfway from 0.1 to 0.7 in 500)
    # seed 1: target 0.3, the best reaches it at 500 (its first crossing, before its end); the arm at 500 too
    arm = {0: _run([0.1, 0.7, 0.7], seed=0), 1: _run([0.1, 0.3, 0.5], seed=1)}
    re = alt.reach(arm, best)
    assert re["R"]["per_seed"] == {0: pytest.approx(250.0), 1: pytest.approx(500.0)}
    assert re["R_ratio"]["per_seed"] == {0: pytest.approx(0.25), 1: pytest.approx(1.0)}
    assert re["W_ratio"]["per_seed"] == {0: pytest.approx(0.25), 1: pytest.approx(1.0)}  # equal step times here
    assert re["R_ratio"]["ci"]["mean"] == pytest.approx(0.625) and re["R_ratio"]["ci"]["lo"] is not None
    never = alt.reach({0: _run([0.1, 0.2, 0.3], seed=0), 1: _run([0.1, 0.4, 0.4], seed=1)}, best)
    assert never["R_ratio"]["not_reached"] == [0] and never["R_ratio"]["ci"]["mean"] is None
    assert never["R_ratio"]["median"] is None  # one of two never reached: the median is above every value


def test_a_best_alternative_that_did_not_improve_leaves_its_seed_out():
    best = {0: _run([0.3, 0.2, 0.1])}  # its final (0.1) is reached at its start: no ratio can be formed
    re = alt.reach({0: _run([0.1, 0.2, 0.3])}, best)
    assert re["left_out"] == [0] and re["R_ratio"]["n"] == 0


def test_section_and_markdown_from_run_directories(tmp_path):
    dirs = {}
    for arm, accs in (("grpo", [0.1, 0.2]), ("fill", [0.1, 0.4])):
        r = tmp_path / arm
        r.mkdir()
        (r / "evals.jsonl").write_text("".join(json.dumps({"step": 5 * i, "generated": 500 * i, "acc_sampled": a}) + "\n"
                                               for i, a in enumerate(accs)))
        (r / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "update_rows": 8, "time/step_s": 1.0}) + "\n"
                                                 for k in range(1, 6)))
        dirs[arm] = {0: r}
    sec = alt.section(dirs)
    assert sec["best_alternative"] == "grpo"
    assert sec["reach"]["fill"]["R"]["per_seed"][0] == pytest.approx(500 / 3)  # 0.1 -> 0.4 crosses GRPO's 0.2 at 1/3
    assert sec["totals"]["fill"]["row_passes"]["mean"] == 40.0 and sec["totals"]["fill"]["train_s"]["mean"] == 5.0
    text = "\n".join(alt.markdown(["grpo", "fill"], {"grpo": "GRPO"}, sec, "axes.png"))
    assert "**GRPO**" in text and "| fill | 40.0 | 500 | 40 | 5.0 | 167 | 0.33x | 0.33x | 0.33x |" in text
    # one seed: a paired difference without an interval, so no part of the preset rule can hold
    assert "| fill - GRPO | +20.0 @ 500 | +20.0 @ 40 | +20.0 @ 5 | +20.0 |" in text
    assert sec["preset_rule"]["rule1"] is False and "Not all three hold" in text


def test_the_report_names_dapo_among_the_arms_that_generate_more_per_step_only_when_it_ran():
    from grpo_replay.experiments.report import _more_rollouts

    assert _more_rollouts({"arms": {"grpo": {"overrides": {"preset": "grpo"}}}}) == "compute-matched GRPO"
    with_dapo = {"arms": {"dapo": {"overrides": {"preset": "grpo", "dynamic_sampling": True}}}}
    assert _more_rollouts(with_dapo) == "compute-matched GRPO, DAPO's dynamic sampling"


def test_paired_differences_are_taken_at_the_largest_budget_both_arms_reach_on_every_seed():
    # grpo ends at 1000 rollouts; dapo generates 4x per step and ends at 4000: they are compared at 1000
    grpo = {0: _run([0.1, 0.2, 0.3], seed=0), 1: _run([0.1, 0.2, 0.4], seed=1)}
    dapo = {0: _run([0.1, 0.5, 0.6], seed=0, rollouts_per_step=400), 1: _run([0.1, 0.3, 0.5], seed=1, rollouts_per_step=400)}
    assert axis_runs.equal_budget(dapo, grpo, "generated") == 1000
    p = axis_runs.paired_at(dapo, grpo, "generated")
    # dapo at 1000 rollouts: halfway to its first evaluation (2000): seed 0 0.3, seed 1 0.2
    assert p["x"] == 1000 and p["n"] == 2 and p["mean"] == pytest.approx(((0.3 - 0.3) + (0.2 - 0.4)) / 2)
    assert axis_runs.paired_at(dapo, grpo, "generated", x=5000)["mean"] is None  # beyond dapo's end: no value


def test_the_preset_rule_needs_all_three_parts(tmp_path):
    def runs(fill_accs, fill_step_s):
        return {"grpo": {s: _run([0.1, 0.2 + 0.01 * s, 0.3 + 0.01 * s], seed=s) for s in range(3)},
                "fill": {s: _run([0.1, *fill_accs[s]], seed=s, step_s=fill_step_s) for s in range(3)}}

    def rule(r):
        sec = {"best_alternative": alt.best_alternative(r), "paired": alt.paired(r)}
        sec["reach"] = {a: alt.reach(rs, r[sec["best_alternative"]]) for a, rs in r.items()}
        return alt.preset_rule(sec)

    fast = [[0.5, 0.55], [0.45, 0.6], [0.5, 0.5]]
    good = rule(runs(fast, 2.0))
    assert good["best"] == "grpo" and good["rule1"] and good["rule2"] and good["rule3"] and good["holds"]
    slow = rule(runs(fast, 8.0))  # same accuracy, each step 5x the time: it loses on training time
    assert slow["rule1"] and slow["rule2"] and not slow["rule3"] and not slow["holds"]
    weak = rule(runs([[0.2, 0.3], [0.2, 0.31], [0.2, 0.28]], 2.0))  # never ahead at equal rollouts
    assert not weak["rule1"] and not weak["holds"]
    assert alt.preset_rule({"best_alternative": None}) is None


def test_a_seed_that_never_reaches_the_target_gives_the_median_with_its_order_statistic_interval():
    best = {s: _run([0.1, 0.2, 0.4], seed=s) for s in range(10)}  # target 0.4 on every seed, reached at 1000
    # seeds 0-6 reach 0.4 at 50 x (s + 1) rollouts (0.1 -> 0.1 + 0.3 x 500 / (50 (s + 1)) at 500); 7-9 never
    arm = {s: _run([0.1, 0.1 + 0.3 * 10 / (s + 1), 0.4], seed=s) if s < 7 else _run([0.1, 0.2, 0.3], seed=s)
           for s in range(10)}
    r = alt.reach(arm, best)["R"]
    assert r["not_reached"] == [7, 8, 9] and r["ci"]["mean"] is None
    # sorted: 50, 100, ..., 350, never x 3: median (250 + 300) / 2; [x_(2), x_(9)] covers it with P = 1 - 2 x 11/1024
    assert r["median"] == pytest.approx(275.0)
    assert r["median_ci"]["lo"] == pytest.approx(100.0) and r["median_ci"]["hi"] is None  # x_(9) was never reached
    assert r["median_ci"]["coverage"] == pytest.approx(1 - 22 / 1024)
    text = alt._reach_text(r, "{:,.0f}", "")
    assert text.startswith("median 275 [100, not reached] (7/10 reached; not: seed 7, 8, 9)")
    assert stats_median_ci([1.0, 2.0, 3.0, 4.0, 5.0])["lo"] is None  # 5 values: no order-statistic interval at 95 %


def stats_median_ci(values):
    from grpo_replay.experiments.stats import median_ci

    return median_ci(values)


def test_a_fixed_reference_is_the_target_and_extra_pairs_are_compared(tmp_path):
    runs = {"grpo": {0: _run([0.1, 0.3])}, "dapo": {0: _run([0.1, 0.2], rollouts_per_step=400)},
            "paper_long": {0: _run([0.1, 0.25, 0.35])}, "dapo_paper": {0: _run([0.1, 0.3], rollouts_per_step=400)}}
    dirs = {}
    for arm, by_seed in runs.items():
        r = tmp_path / arm
        r.mkdir()
        run = by_seed[0]
        (r / "evals.jsonl").write_text("".join(json.dumps({"step": 5 * i, "generated": g, "acc_sampled": a}) + "\n"
                                               for i, (g, a) in enumerate(zip(run.xs["generated"], run.ys))))
        (r / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "update_rows": 10, "time/step_s": 2.0}) + "\n"
                                                 for k in range(1, 5 * (len(run.ys) - 1) + 1)))
        dirs[arm] = {0: r}
    assert alt.section(dirs)["best_alternative"] == "grpo"  # without a reference: the best arm without replay
    sec = alt.section(dirs, reference="dapo", pairs=(("dapo_paper", "paper_long"), ("nope", "grpo")))
    assert sec["best_alternative"] == "dapo" and sec["reference_fixed"]
    assert sec["reach"]["paper_long"]["R"]["per_seed"][0] == pytest.approx(1000 / 3)  # DAPO's final 0.2: 2/3 of 0.1 -> 0.25
    assert set(sec["paired"]) == {"paper_long-grpo", "paper_long-dapo", "dapo_paper-grpo", "dapo_paper-dapo",
                                  "dapo_paper-paper_long"}  # a pair with an arm that did not run is left out
    assert sec["paired"]["dapo_paper-paper_long"]["generated"]["x"] == 1000  # paper_long ends there
    text = "\n".join(alt.markdown(list(runs), {}, sec, None))
    assert "the reference arm fixed in advance, **dapo**" in text and "| dapo_paper - paper_long |" in text
    assert alt.section(dirs, reference="absent")["best_alternative"] is None  # a reference that did not run: no target


def test_the_pick_at_each_arm_s_end_is_the_best_arm_measured_there_with_its_difference_to_the_runner_up():
    from grpo_replay.experiments import budget_picks

    runs = {"grpo": {s: _run([0.1, 0.2 + 0.01 * s, 0.25 + 0.01 * s], seed=s) for s in range(3)},   # ends at 1000
            "fill": {s: _run([0.1, 0.3 + 0.01 * s, 0.32 + 0.02 * s, 0.33 + 0.02 * s], seed=s) for s in range(3)},
            "dapo": {s: _run([0.1, 0.2, 0.45 + 0.01 * s], seed=s, rollouts_per_step=150) for s in range(3)}}  # 1500
    rows = budget_picks.picks(runs, "generated")
    assert [r["x"] for r in rows] == [1000, 1500]
    at_1000, at_1500 = rows
    assert at_1000["arms"][0] == "fill" and set(at_1000["arms"]) == {"grpo", "fill", "dapo"}
    # fill at 1000: 0.32 + 0.02 s; dapo at 1000 (2/3 of 0.2 -> 0.45 + 0.01 s from 750 to 1500): lower on every seed
    assert at_1000["acc"]["mean"] == pytest.approx(0.34) and at_1000["runner_up"] in ("grpo", "dapo")
    assert at_1000["diff"]["x"] == 1000 and at_1000["diff"]["lo"] > 0
    assert at_1500["arms"] == ["dapo", "fill"]  # grpo ended at 1000: not extrapolated
    text = "\n".join(budget_picks.markdown({"generated": rows}, alt.AXES, {}))
    assert "| generated rollouts | 1,000 | fill |" in text and "| generated rollouts | 1,500 | dapo" in text
