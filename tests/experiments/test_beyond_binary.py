"""The arms and comparisons of section I (docs/results/PLAN.md): a graded reward, and binary rewards under RLOO and
Dr. GRPO. Each arm is its parent arm plus its family's one setting; `compare --quick` runs the three comparisons
end to end at tiny sizes (a few steps each, not a result) and the runs differ where the arms say only."""
import dataclasses

import yaml

from grpo_replay.app import configio
from grpo_replay.cli import main
from grpo_replay.experiments.run_hash import UNHASHED
from grpo_replay.experiments.arms import COMPARISONS, FULL, PRIORITY_ORDER, QUICK, make_arms, seed_overrides
from grpo_replay.experiments.beyond_binary import ARM_NAMES, FAMILY_ARMS, PARENT, arm_name
from grpo_replay.trainer.train_config import resolve
from helpers import read_jsonl

H_SETS = {"steps": 300, "eval_every": 50, "eval_problems": 1024, "eval_samples": 8, "drift_probe": 64,
          "checkpoint_every": 50}
UNDO = {"graded": {"reward_funcs": (), "reward_weights": ()}, "rloo": {"advantage_estimator": "grpo"},
        "dr_grpo": {"advantage_scale": "group"}}


def test_each_arm_is_its_parent_plus_its_familys_setting_only():
    arms = make_arms(FULL)
    for family, bases in FAMILY_ARMS.items():
        for base in bases:
            name = arm_name(family, base)
            cfg = resolve({**FULL.overrides, **H_SETS, **arms[name].overrides})
            parent = resolve({**FULL.overrides, **H_SETS, **arms[PARENT[base]].overrides})
            assert cfg != parent and dataclasses.replace(cfg, **UNDO[family]) == parent, name
            assert arms[name].same_budget
    for c in ("graded", "rloo", "dr_grpo"):
        comp = COMPARISONS[c]
        assert c in PRIORITY_ORDER and comp.on_axes and comp.reference == comp.arms[1] and comp.reference.endswith("_grpo")


def _config(run_dir):
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def _flat(cfg) -> dict:
    """The config's keys that change what a run computes (not where its files go)."""
    return {k: v for k, v in cfg.flat().items() if k not in UNHASHED}


def test_compare_quick_runs_the_three_comparisons_and_the_arms_differ_where_they_say(tmp_path):
    out = tmp_path / "out"
    rc = main(["compare", "--quick", "--comparisons", "graded,rloo,dr_grpo", "--seeds", "1", "--out", str(out),
               "--jobs", "1", "--no-progress"])
    assert rc == 0
    runs = {d.parent.name: d for d in (out / "runs").glob("*/*") if (d / "summary.json").exists()}
    assert set(runs) == {"grpo", *ARM_NAMES}
    # each run's resolved config, with its family's setting undone, is its parent arm's at the same seed
    arms = make_arms(QUICK)
    for family, bases in FAMILY_ARMS.items():
        for base in bases:
            name = arm_name(family, base)
            cfg = _flat(resolve(configio.flatten(_config(runs[name]))))
            parent = _flat(resolve({**QUICK.overrides, **arms[PARENT[base]].overrides, **seed_overrides(0)}))
            undone = _flat(dataclasses.replace(resolve(configio.flatten(_config(runs[name]))), **UNDO[family]))
            assert undone == parent and cfg != parent, name
    first = {a: read_jsonl(d / "metrics.jsonl")[0] for a, d in runs.items()}
    # the same seed's first rollouts: equal for the binary families, scored differently by the graded reward
    assert first["rloo_grpo"]["reward"] == first["drgrpo_grpo"]["reward"] == first["grpo"]["reward"]
    assert len({first[a]["fresh/abs_adv"] for a in ("grpo", "rloo_grpo", "drgrpo_grpo")}) == 3
    assert all("rewards/digits/mean" in first[arm_name("graded", b)] for b in FAMILY_ARMS["graded"])
    assert "rewards/digits/mean" not in first["grpo"]
    md = (out / "report" / "report.md").read_text() if (out / "report").exists() else None
    report = md or next(out.glob("**/report.md")).read_text()
    for title in ("Graded reward", "Binary reward, RLOO advantages", "Binary reward, Dr. GRPO advantages"):
        assert title in report
    assert report.count("the reference arm fixed in advance") == 3
