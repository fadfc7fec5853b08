"""`grpo-replay compare --quick`: end to end (runs, tables, plots, JSON/CSV, resumability) plus the statistics."""
import csv
import json
import math
from pathlib import Path

import pytest

from grpo_replay.cli import main
from grpo_replay.eval.metrics import mean_pass_at_k
from grpo_replay.experiments import claims, stats
from grpo_replay.experiments.arms import COMPARISONS, FULL, OPTION_VALUES, OPTIONS_CHOSEN, QUICK, arms_for, make_arms, option_arm_name
from grpo_replay.trainer.train_config import resolve


def _close(a, b, tol=1e-9):
    return a is not None and b is not None and abs(a - b) <= tol


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    rc = main(["compare", "--quick", "--out", str(out), "--jobs", "2", "--no-progress"])
    assert rc == 0
    return out


@pytest.mark.slow
def test_outputs_exist(quick_out):
    rep = quick_out / "report"
    for name in ("report.md", "results.json", "results.csv", "runs.csv", "tau_max.png",
                 "accuracy_main.png", "pass_at_k_main.png", "accuracy_compute.png", "pass_at_k_compute.png"):
        assert (rep / name).exists() and (rep / name).stat().st_size > 0, name
    md = (rep / "report.md").read_text()
    assert md.splitlines()[5] == f"grpo-replay compare --quick --out {quick_out} --jobs 2 --no-progress"
    for claim in ("|A_i| > sigma_g > uniform", "fresh-anchored > pool", "moderate tau_max", "correct responses longer",
                  "beats GRPO"):
        assert claim.replace("|", "\\|") in md
    prov = json.loads((rep / "results.json").read_text())["provenance"]
    assert f"Code: commit `{prov['commit']}`, grpo-replay {prov['grpo_replay']}, torch {prov['torch']}" in md


@pytest.mark.slow
def test_numbers_consistent(quick_out):
    res = json.loads((quick_out / "report" / "results.json").read_text())
    assert res["missing_runs"] == []
    assert set(res["arm_stats"]) == set(arms_for(QUICK.comparisons, QUICK.only_arms))
    runs = list(csv.DictReader(open(quick_out / "report" / "runs.csv")))
    assert len(runs) == len(arms_for(QUICK.comparisons, QUICK.only_arms)) * QUICK.seeds
    for arm, st in res["arm_stats"].items():
        per_seed = [float(r["acc_sampled"]) for r in runs if r["arm"] == arm]
        f = st["final"]["acc_sampled"]
        assert f["n"] == QUICK.seeds
        assert _close(f["mean"], sum(per_seed) / len(per_seed))
        assert f["lo"] <= f["mean"] <= f["hi"]
        # pass@1 is mean@n; pass@k grows with k
        pk = st["pass_at_k"]
        assert _close(pk["1"]["mean"], f["mean"])
        ks = sorted(int(k) for k in pk if k != "diff")
        assert all(pk[str(a)]["mean"] <= pk[str(b)]["mean"] + 1e-12 for a, b in zip(ks, ks[1:]))
        for b in st["budgets"].values():
            for key in ("acc_sampled", "acc_greedy"):
                if b[key]["lo"] is not None:
                    assert b[key]["lo"] <= b[key]["mean"] <= b[key]["hi"]
    base = res["arm_stats"]["grpo"]["final"]
    assert _close(base["acc_sampled_diff"]["mean"], 0.0)
    # the compute-matched arm generates (1 + replay_ratio) x as many rollouts per step
    gen = {a: st["final"]["generated"]["mean"] for a, st in res["arm_stats"].items()}
    assert gen["grpo_cm"] == pytest.approx(1.5 * gen["grpo"]) and gen["paper"] == gen["grpo"]


@pytest.mark.slow
def test_pass_at_k_matches_metric_code(quick_out):
    run_dir = next((quick_out / "runs" / "paper").glob("seed0-*"))
    final = [json.loads(l) for l in (run_dir / "evals.jsonl").read_text().splitlines()][-1]
    run = stats.load_run("paper", 0, run_dir)
    n = final["n_samples"]
    assert _close(run.pass_at([2])[2], mean_pass_at_k([(n, c) for c in final["counts"]], 2))
    assert _close(run.pass_at([2])[2], final["pass@k"]["2"])


@pytest.mark.slow
def test_rerun_skips_and_resumes(quick_out, capsys):
    summaries = sorted((quick_out / "runs").glob("*/*/summary.json"))
    res = json.loads((quick_out / "report" / "results.json").read_text())
    made_here = res["provenance"]["commit"]
    assert res["run_commits"] == {made_here: len(summaries)}
    here = f"{res['provenance']['cpu']} / {res['provenance']['cpu_capability']}"
    assert res["run_cpu_kinds"] == {here: len(summaries)}
    md = (quick_out / "report" / "report.md").read_text()
    assert "Its runs were made at" not in md and "more than one CPU kind" not in md
    # A reused run that older code made on another CPU kind: the regenerated report names both.
    old = json.loads(summaries[1].read_text())
    old["provenance"].update(commit="0ld0ld0", cpu="Other CPU", cpu_capability="AVX2")
    summaries[1].write_text(json.dumps(old))
    mtimes = {p: p.stat().st_mtime_ns for p in summaries}
    rc = main(["compare", "--quick", "--out", str(quick_out), "--no-progress"])
    assert rc == 0
    res = json.loads((quick_out / "report" / "results.json").read_text())
    assert res["run_info"]["ran"] == 0 and res["run_info"]["skipped"] == len(summaries)
    assert all(p.stat().st_mtime_ns == m for p, m in mtimes.items())
    assert res["run_commits"] == {made_here: len(summaries) - 1, "0ld0ld0": 1}
    assert res["run_cpu_kinds"] == {here: len(summaries) - 1, "Other CPU / AVX2": 1}
    md = (quick_out / "report" / "report.md").read_text()
    assert f"Its runs were made at commit `{made_here}` ({len(summaries) - 1} runs), `0ld0ld0` (1 run)" in md
    assert f"more than one CPU kind: {here} ({len(summaries) - 1} runs), Other CPU / AVX2 (1 run)" in md
    # an unfinished run (no summary.json) is run again, resuming from its checkpoint; the others are skipped
    summaries[0].unlink()
    rc = main(["compare", "--quick", "--out", str(quick_out), "--jobs", "1", "--no-progress"])
    assert rc == 0 and summaries[0].exists()
    res = json.loads((quick_out / "report" / "results.json").read_text())
    assert res["run_info"]["ran"] == 1 and res["run_info"]["skipped"] == len(summaries) - 1


def test_dry_run_and_bad_comparison(tmp_path, capsys):
    assert main(["compare", "--quick", "--out", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("todo") == len(arms_for(QUICK.comparisons, QUICK.only_arms)) * QUICK.seeds
    assert main(["compare", "--quick", "--out", str(tmp_path), "--comparisons", "nope"]) == 2


def test_zero_seeds_is_an_error(tmp_path, capsys):
    assert main(["compare", "--quick", "--out", str(tmp_path), "--seeds", "0", "--dry-run"]) == 2
    assert "--seeds must be >= 1" in capsys.readouterr().err
    assert main(["compare", "--quick", "--out", str(tmp_path), "--jobs", "0", "--dry-run"]) == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err


def test_full_setting_arms():
    arms = make_arms(FULL)
    names = arms_for(FULL.comparisons)
    assert names[0] == "grpo" and len(names) == len(set(names))
    for n in ("grpo", "uniform_pool", "sigma_pool", "paper", "tau1", "tau2", "tau5", "tau20", "tau_none",
              "comp_pool", "prio_sigma", "prio_uniform", "grpo_cm", "alpha1"):
        assert n in names
    assert arms["grpo_cm"].overrides["prompts_per_step"] == round(1.5 * FULL.overrides["prompts_per_step"])
    assert arms["tau_none"].overrides["replay.tau_max"] is None
    # The full setting runs the paper's comparisons; the options have their own longer setting (PLAN.md, F).
    assert set(COMPARISONS) - set(FULL.comparisons) == {"options", "options_pilot", "alternatives", "alternatives_pilot",
                                                        "dapo_budget", "with_dapo", "graded", "rloo", "dr_grpo"}


def test_the_alternatives_comparison_holds_grpo_more_epochs_dapo_and_replay_each_a_valid_config(tmp_path, capsys):
    arms = make_arms(FULL)
    want = ("grpo", "grpo_mu2", "dapo", "paper", "fill")  # the pilot (PLAN.md, G1) dropped grpo_mu4 and fill_mu2
    assert COMPARISONS["alternatives"].arms == want
    candidates = ("grpo", "grpo_mu2", "grpo_mu4", "dapo", "dapo_r3", "fill", "fill_mu2")
    assert COMPARISONS["alternatives_pilot"].arms == candidates and set(want) - {"paper"} <= set(candidates)
    cfgs = {a: resolve(dict(arms[a].overrides)) for a in (*want, *candidates)}
    assert [cfgs[a].update_epochs for a in want] == [1, 2, 1, 1, 1]
    assert cfgs["grpo_mu4"].update_epochs == 4 and cfgs["fill_mu2"].update_epochs == 2
    assert cfgs["dapo"].dynamic_sampling and cfgs["dapo"].max_generation_rounds == 10 and cfgs["dapo"].replay.replay_ratio == 0
    assert cfgs["dapo_r3"].max_generation_rounds == 3 and cfgs["dapo"].eval_every == cfgs["dapo_r3"].eval_every == 10
    assert cfgs["fill_mu2"].replay.fill_filtered and cfgs["fill"].replay.fill_filtered
    assert not arms["dapo"].same_budget and all(arms[a].same_budget for a in want if a != "dapo")  # DAPO generates more
    assert main(["compare", "--comparisons", "alternatives", "--seeds", "2", "--out", str(tmp_path), "--dry-run"]) == 0
    planned = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("todo")]
    assert planned == [a for a in want for _ in range(2)]


def test_every_option_arm_is_the_paper_plus_one_valid_option_and_the_chosen_ones_exist():
    arms = make_arms(FULL)
    for option, values in OPTION_VALUES.items():
        for v in values:
            a = arms[option_arm_name(option, v)]
            assert a.overrides == {"preset": "paper", f"replay.{option}": v}
            cfg = resolve(dict(a.overrides))
            assert getattr(cfg.replay, option) == v
    assert set(OPTIONS_CHOSEN) <= set(arms)
    assert COMPARISONS["options"].arms == ("grpo", "paper", *OPTIONS_CHOSEN)
    pilot = COMPARISONS["options_pilot"].arms
    assert pilot[0] == "grpo" and "fill" not in pilot and len(pilot) == 1 + sum(len(v) for v in OPTION_VALUES.values() if len(v) > 1)
    # The full setting's default stays the paper's comparisons.
    assert "options" not in FULL.comparisons and "options_pilot" not in FULL.comparisons


def test_first_seed_moves_the_seeds_and_a_negative_one_is_refused(tmp_path, capsys):
    rc = main(["compare", "--quick", "--out", str(tmp_path), "--first-seed", "10", "--seeds", "2", "--dry-run"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "seed 10" in out and "seed 11" in out and "seed 0 " not in out and "seed 12" not in out
    import argparse

    from grpo_replay.cli.compare import add_arguments, command_line

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert "--first-seed 10" in command_line(parser.parse_args(["--quick", "--first-seed", "10"]))
    out = tmp_path / "refused"
    assert main(["compare", "--quick", "--out", str(out), "--first-seed", "-1"]) == 2
    assert "--first-seed=-1 is invalid; allowed: an integer >= 0" in capsys.readouterr().err
    assert not out.exists()  # refused before anything is written


# ------------------------------------------------------------------------------------------- statistics
def test_ci_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    xs = [0.1, 0.3, 0.2, 0.5, 0.4]
    c = stats.ci(xs)
    lo, hi = scipy_stats.t.interval(0.95, len(xs) - 1, loc=sum(xs) / 5, scale=scipy_stats.sem(xs))
    assert c["n"] == 5 and _close(c["lo"], lo) and _close(c["hi"], hi)
    assert stats.ci([None, 0.3])["lo"] is None and stats.ci([])["mean"] is None
    assert _close(stats.t_quantile(4), 2.7764451051977987, 1e-9)


def test_interp_and_budget_to_reach():
    xs, ys = [0, 10, 20], [0.1, 0.3, 0.2]
    assert _close(stats.interp(xs, ys, 5), 0.2) and stats.interp(xs, ys, 25) is None
    assert _close(stats.budget_to_reach(xs, ys, 0.2), 5.0)
    assert stats.budget_to_reach(xs, ys, 0.1) == 0.0 and stats.budget_to_reach(xs, ys, 0.5) is None


def test_verdicts():
    assert claims.verdict({"mean": 0.02, "lo": 0.01, "hi": 0.03, "n": 5}) == claims.HOLDS
    assert claims.verdict({"mean": 0.02, "lo": -0.01, "hi": 0.05, "n": 5}) == claims.WEAK
    assert claims.verdict({"mean": -0.02, "lo": -0.05, "hi": 0.01, "n": 5}) == claims.FAILS
    assert claims.verdict({"mean": -0.02, "lo": -0.03, "hi": -0.01, "n": 5}, sign=-1) == claims.HOLDS
    assert claims.verdict({"mean": None}) == claims.UNTESTED


def test_verdict_of_an_exact_zero_difference_with_float_noise():
    """Equal total accuracy over 5 seeds; the float mean of the paired differences is 3.3e-17, not 0."""
    a, b = [0.516, 0.026, 0.031, 0.92, 0.464], [0.623, 0.525, 0.118, 0.212, 0.479]

    def runs(arm, accs):
        return [stats.Run(arm, s, [{"acc_sampled": x}], 0, 0) for s, x in enumerate(accs)]

    d = stats.paired_diff(runs("paper", a), runs("grpo", b), lambda r: r.final["acc_sampled"])
    assert d["mean"] != 0  # the float noise this test is about
    assert claims.verdict(d) == claims.FAILS and claims.verdict(d, sign=-1) == claims.FAILS
    same = stats.paired_diff(runs("paper", [0.1, 0.3, 0.7]), runs("grpo", [0.1, 0.3, 0.7]), lambda r: r.final["acc_sampled"])
    assert claims.verdict(same) == claims.FAILS
    noisy = {"mean": 1e-17, "lo": 1e-17, "hi": 2e-17, "n": 5}  # a zero-width CI at float noise above 0
    assert claims.verdict(noisy) == claims.FAILS
    assert claims.verdict({"mean": 0.004, "lo": 1e-17, "hi": 0.008, "n": 5}) == claims.WEAK
    assert math.isclose(stats.ci([1.0, 1.0, 1.0])["lo"], 1.0)


# ------------------------------------------------------------------------------ minimum detectable effect
def _runs(arm, accs, **final):
    return [stats.Run(arm, s, [{"acc_sampled": x, "acc_greedy": x, **final}], 0, 0) for s, x in enumerate(accs)]


def test_mde_of_a_known_sd_and_n():
    # (t_{0.975,4} + t_{0.80,4}) * sd / sqrt(5), the quantiles from a t table (2.7764, 0.9410)
    assert _close(stats.mde(0.02, 5), (2.7764451051977987 + 0.9409646133567969) * 0.02 / math.sqrt(5), 1e-9)
    assert _close(stats.mde(0.0, 3), 0.0)  # no spread: any difference is detectable
    assert stats.mde(None, 1) is None and stats.mde(0.02, 1) is None and stats.mde(float("nan"), 4) is None
    # paired_diff carries it, from the sd of the per-seed differences
    d = stats.paired_diff(_runs("paper", [0.3, 0.5, 0.4, 0.6]), _runs("grpo", [0.2, 0.5, 0.2, 0.4]), lambda r: r.final["acc_sampled"])
    assert _close(d["mde"], stats.mde(d["sd"], 4)) and d["mde"] > 0
    assert claims.pp(d).endswith(f"(n=4, MDE {100 * d['mde']:.1f} pp)")
    assert stats.format_ci(d, fmt="{:+.1f}", unit=" pp", show_mde=True) == "+12.5 pp [-2.7, +27.7] (MDE 19.9 pp)"


def test_mde_with_one_seed_is_n_a_not_a_crash():
    one = stats.paired_diff(_runs("paper", [0.4]), _runs("grpo", [0.3]), lambda r: r.final["acc_sampled"])
    assert one["mde"] is None and one["lo"] is None
    assert claims.pp(one) == "+10.0 pp (n=1, MDE n/a)"
    assert stats.paired_diff([], [], lambda r: 0.0)["mde"] is None
    runs = {a: _runs(a, [0.3], len_correct=5.0, len_incorrect=4.0, len_all=4.5) for a in ("grpo", "paper", "comp_pool")}
    checked = {c["claim"]: c for c in claims.check_claims(runs)}
    beats = checked["Replay (the paper's method) beats GRPO"]
    assert beats["numbers"]["sampled"]["mde"] is None and "MDE n/a" in beats["evidence"][0]
    length = checked["Length: correct responses longer, incorrect ones shorter than GRPO's"]
    assert "MDE n/a" in length["evidence"][0] and "mde" in length["numbers"]["len_correct_rel"]


@pytest.mark.slow
def test_report_shows_mde_beside_each_claim_ci(quick_out):
    res = json.loads((quick_out / "report" / "results.json").read_text())
    assert res["power"] == 0.8
    beats = next(c for c in res["claims"] if c["claim"] == "Replay (the paper's method) beats GRPO")
    d = beats["numbers"]["sampled"]
    assert d["n"] == QUICK.seeds and _close(d["mde"], stats.mde(d["sd"], d["n"]), 1e-12)
    md = (quick_out / "report" / "report.md").read_text()
    assert f"(n={QUICK.seeds}, MDE " in md and "MDE = the minimum detectable effect" in md


def test_testbed_flag_plans_the_reasoning_variant_and_quick_refuses_it(tmp_path, capsys):
    assert main(["compare", "--testbed", "reasoning", "--out", str(tmp_path / "r"), "--arms", "paper", "--seeds", "1",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("todo") == 2  # grpo (always) + paper, one seed
    # --quick's tiny addition testbed cannot describe another task: refused before any run, naming the key
    for argv in (["--testbed", "reasoning"], ["--set", "testbed_preset=reasoning"]):
        assert main(["compare", "--quick", "--out", str(tmp_path / "q"), "--dry-run", *argv]) == 2
        err = capsys.readouterr().err
        assert "testbed_preset='reasoning' is invalid with --quick" in err and "allowed with --quick: default" in err
    assert main(["compare", "--testbed", "reasoning", "--model", "m.gguf", "--out", str(tmp_path / "m"), "--dry-run"]) == 2
    assert "cannot go with --model" in capsys.readouterr().err
    assert not (tmp_path / "q").exists() and not (tmp_path / "m").exists()


@pytest.mark.parametrize("flags", [["--seeds", "1", "--seeds", "2"], ["--out", "a", "--out", "b"],
                                   ["--jobs", "1", "--jobs", "2"], ["--eval-n", "2", "--eval-n", "4"]])
def test_a_compare_flag_given_twice_is_refused(flags, tmp_path, capsys):
    """As in train and eval: the second value would silently win."""
    with pytest.raises(SystemExit) as e:
        main(["compare", "--quick", *flags])
    assert e.value.code == 2
    assert f"{flags[0]} is given twice ({flags[0]} {flags[1]} and {flags[2]} {flags[3]}); give it once" in capsys.readouterr().err


def test_compare_backend_trl_with_a_setting_trl_refuses_is_exit_2_before_any_run(tmp_path, capsys):
    """The refusal is the config check's, before any warm start or run (it was a failed run each, exit 1)."""
    out = tmp_path / "cmp"
    assert main(["compare", "--quick", "--out", str(out), "--backend", "trl", "--set", "drift_probe=4"]) == 2
    assert "TrainConfig.drift_probe=4 is invalid; allowed: 0" in capsys.readouterr().err
    assert not (out / "runs").exists() and not (out / "testbed-cache").exists()


def _plan_lines(out, capsys, *argv):
    assert main(["compare", "--quick", "--out", str(out), "--dry-run", *argv]) == 0
    return [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(("done", "todo"))]


def test_a_setting_finished_runs_lack_runs_them_again_and_the_report_claims_only_what_every_run_has(tmp_path, capsys):
    """drift_probe and report_to add to what a run writes (the drift/* columns, the trackers' logs): finished runs
    made without them are not reused as if they had them. drift_probe is hashed (a run made before it was, under
    the older directory name, is reused when its config holds the value asked for); a tracker the runs lack is
    refused, since its logs cannot be added to a run afterwards."""
    out = tmp_path / "cmp"
    plain = _plan_lines(out, capsys)
    for _, _, _, _, run_dir in plain:  # every run finished, made without the probe or a tracker
        d = Path(run_dir)
        d.mkdir(parents=True)
        (d / "summary.json").write_text("{}")
        (d / "config.yaml").write_text(resolve({}).to_yaml())
    assert {line[0] for line in _plan_lines(out, capsys)} == {"done"}
    assert {line[0] for line in _plan_lines(out, capsys, "--set", "drift_probe=4")} == {"todo"}
    assert main(["compare", "--quick", "--out", str(out), "--report-to", "tensorboard"]) == 2
    assert (f"report_to=tensorboard: {len(plain)} of the planned runs were started without tensorboard"
            in capsys.readouterr().err)
    assert not list(out.glob("runs/*/*/tensorboard")) and not (out / "report").exists()
    # one of them made with drift_probe=4 before the key was hashed: that one is reused, with its directory
    d = Path(plain[0][4])
    (d / "config.yaml").write_text(resolve({"drift_probe": 4}).to_yaml())
    probed = _plan_lines(out, capsys, "--set", "drift_probe=4")
    assert probed[0] == ["done", *plain[0][1:]] and {line[0] for line in probed[1:]} == {"todo"}
    # the report's shared settings: what every planned run has, not a key that changes nothing in the results
    rep = tmp_path / "rep"
    assert main(["compare", "--quick", "--out", str(tmp_path / "none"), "--report-only", "--report-dir", str(rep),
          "--set", "drift_probe=4", "--set", "testbed.progress_every=3"]) == 0
    shared = json.loads((rep / "results.json").read_text())["overrides"]
    assert shared["drift_probe"] == 4 and "testbed.progress_every" not in shared
    assert "preset" not in shared and "seed" not in shared  # each arm's and each seed's own


def test_a_compare_runs_config_reused_from_another_directory_finds_its_warm_start(tmp_path, monkeypatch, capsys):
    """The run's config.yaml names the warm-start cache absolutely: `train --config` from elsewhere loads the warm
    start instead of computing it again into a stray `cmp/testbed-cache` under the new directory."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir(), elsewhere.mkdir()
    monkeypatch.chdir(work)
    assert main(["compare", "--quick", "--out", "cmp", "--seeds", "1", "--arms", "grpo", "--jobs", "1", "--no-progress"]) == 0
    (config,) = (work / "cmp").glob("runs/grpo/*/config.yaml")
    monkeypatch.chdir(elsewhere)
    assert main(["train", "--config", str(config), "--out", "again", "--no-progress"]) == 0
    assert sorted(p.name for p in elsewhere.iterdir()) == ["again"]
    warm = json.loads((elsewhere / "again" / "summary.json").read_text())["setup"]["warm_start"]
    assert warm["from_cache"] and warm["cache_path"].startswith(str(work / "cmp" / "testbed-cache"))
