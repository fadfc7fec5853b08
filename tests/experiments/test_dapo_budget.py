"""The arms and comparisons of replay at DAPO's budget and replay with DAPO (docs/results/PLAN.md, section H): each
arm a valid config that differs from its parent only where it says, the long arms continuing the 300-step runs of
the same --out, and both comparisons end to end at tiny sizes (a few steps each, not a result)."""
import dataclasses

import pytest

from grpo_replay.cli import main
from grpo_replay.experiments import jobs
from grpo_replay.experiments.arms import CAPPED_ROUNDS, COMPARISONS, FULL, LONG_STEPS, QUICK, arms_for, make_arms
from grpo_replay.experiments.report import build_report
from grpo_replay.trainer.train_config import resolve

# The settings every run of section H takes (F's and G's): `--set` of its commands.
H_SETS = {"steps": 300, "eval_every": 50, "eval_problems": 1024, "eval_samples": 8, "drift_probe": 64,
          "checkpoint_every": 50}


def test_each_new_arm_is_its_parent_plus_what_its_name_says():
    arms = make_arms(FULL)
    cfg = {a: resolve({**FULL.overrides, **H_SETS, **arms[a].overrides}) for a in
           ("grpo", "paper", "fill", "dapo", "grpo_long", "paper_long", "fill_long", "dapo_paper", f"fill_r{CAPPED_ROUNDS}")}
    for long, short in (("grpo_long", "grpo"), ("paper_long", "paper"), ("fill_long", "fill")):
        assert cfg[long].steps == LONG_STEPS and cfg[short].steps == 300
        assert dataclasses.replace(cfg[long], steps=300) == cfg[short]  # only longer
    assert LONG_STEPS * 16 * 8 >= 246_016  # above every seed's budget of DAPO's 300-step runs in G2
    dp = cfg["dapo_paper"]
    assert dp.dynamic_sampling and dp.max_generation_rounds == 10 and dp.eval_every == cfg["dapo"].eval_every
    assert dataclasses.replace(dp, dynamic_sampling=False, eval_every=50) == cfg["paper"]  # paper + DAPO's sampling
    fr = cfg[f"fill_r{CAPPED_ROUNDS}"]
    assert fr.dynamic_sampling and fr.max_generation_rounds == CAPPED_ROUNDS and fr.replay.fill_filtered
    assert fr.steps * CAPPED_ROUNDS == LONG_STEPS and fr.eval_every * CAPPED_ROUNDS == 50  # same budget and schedule
    assert all(not arms[a].same_budget for a in ("grpo_long", "paper_long", "fill_long", "dapo_paper"))
    assert COMPARISONS["dapo_budget"].reference == COMPARISONS["with_dapo"].reference == "dapo"


def test_the_long_arms_share_the_lineage_of_the_300_step_runs_and_are_planned_after_them(tmp_path, capsys):
    arms = make_arms(FULL)
    base = {**FULL.overrides, **H_SETS}
    specs = jobs.plan([arms[a] for a in arms_for(("dapo_budget",))], [0], base, tmp_path)
    by = {s.arm: s for s in specs}
    assert by["grpo_long"].lineage == by["grpo"].lineage and by["grpo_long"].steps == LONG_STEPS
    assert by["paper_long"].lineage != by["grpo"].lineage
    sets = [x for k, v in H_SETS.items() for x in ("--set", f"{k}={v}")]
    assert main(["compare", "--comparisons", "dapo_budget,with_dapo", "--seeds", "1", "--out", str(tmp_path),
                 "--dry-run", *sets]) == 0
    planned = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("todo")]
    assert planned == ["grpo", "dapo", "grpo_long", "paper_long", "fill_long", "dapo_paper", f"fill_r{CAPPED_ROUNDS}"]


@pytest.mark.slow
def test_both_comparisons_end_to_end_at_tiny_sizes(tiny_overrides, tmp_path):
    base = {**tiny_overrides, "steps": 2, "eval_every": 2, "checkpoint_every": 2}
    tiny = {"grpo_long": {"steps": 4}, "paper_long": {"steps": 4}, "fill_long": {"steps": 4}, "dapo": {"eval_every": 1},
            "dapo_paper": {"eval_every": 1}, f"fill_r{CAPPED_ROUNDS}": {"steps": 2, "eval_every": 1}}
    setting = dataclasses.replace(QUICK, overrides=base, only_arms=None, budgets=2)
    arms = {n: dataclasses.replace(a, overrides={**a.overrides, **tiny.get(n, {})}) for n, a in make_arms(setting).items()}
    comparisons = ["dapo_budget", "with_dapo"]
    names = arms_for(tuple(comparisons))
    names.insert(names.index("paper_long"), "paper")  # the 300-step parents the long arms continue
    names.insert(names.index("fill_long"), "fill")
    specs = jobs.plan([arms[n] for n in names], [0], base, tmp_path / "out")
    res = jobs.execute(specs, jobs=2, progress=False)
    assert res["ran"] == len(specs) and not res["failed"]
    for long in ("grpo_long", "paper_long", "fill_long"):
        assert (next(s for s in specs if s.arm == long).run_dir / ".grpo-replay-continued.json").exists()
    results = build_report(specs, arms, setting, comparisons, tmp_path / "report", "test")
    sec = results["comparisons"]["with_dapo"]["alternatives"]
    assert sec["best_alternative"] == "dapo" and sec["reference_fixed"]
    assert {"dapo_paper-dapo", "dapo_paper-paper_long", f"fill_r{CAPPED_ROUNDS}-fill_long",
            f"fill_r{CAPPED_ROUNDS}-dapo"} <= set(sec["paired"])
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.count("the reference arm fixed in advance") == 2
    assert (tmp_path / "report" / "axes_dapo_budget.png").exists() and (tmp_path / "report" / "axes_with_dapo.png").exists()


@pytest.mark.parametrize("comparison", ["dapo_budget", "with_dapo", "alternatives", "composition"])
def test_a_quick_run_of_a_comparison_runs_its_arms_at_quick_sizes(tmp_path, capsys, comparison):
    """`compare --quick --comparisons X` plans X's arms (not GRPO alone, as the quick arm list once made it), each at
    the quick sizes: the long arms twice the quick steps, every arm evaluated on the quick schedule."""
    assert main(["compare", "--quick", "--comparisons", comparison, "--seeds", "1", "--out", str(tmp_path),
                 "--dry-run"]) == 0
    planned = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("todo")]
    assert planned == list(COMPARISONS[comparison].arms)
    arms = make_arms(QUICK)
    for name in planned:
        cfg = resolve({**QUICK.overrides, **arms[name].overrides})
        assert cfg.steps <= 2 * QUICK.overrides["steps"] and cfg.eval_every <= QUICK.overrides["eval_every"], name
    assert make_arms(QUICK)["paper_long"].overrides["steps"] == 2 * QUICK.overrides["steps"]
