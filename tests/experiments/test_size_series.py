"""`grpo-replay compare --size-series`: the model-size series, its trend statistic and its report."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from grpo_replay.cli import main
from grpo_replay.experiments import claims, size_series
from grpo_replay.experiments.stats import slope_ci
from grpo_replay.tasks.testbed.testbed_config import SIZE_SERIES, TESTBED_PRESETS, TestbedConfig


def test_slope_ci_matches_scipy_linregress():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x = np.repeat([0.0, 1.0, 2.0], 5)
    y = 0.01 + 0.02 * x + rng.normal(0, 0.01, x.size)
    got = slope_ci(x, y)
    ref = stats.linregress(x, y)
    t = stats.t.ppf(0.975, x.size - 2)
    assert got["mean"] == pytest.approx(ref.slope)
    assert got["intercept"] == pytest.approx(ref.intercept)
    assert got["se"] == pytest.approx(ref.stderr)
    assert got["lo"] == pytest.approx(ref.slope - t * ref.stderr)
    assert got["hi"] == pytest.approx(ref.slope + t * ref.stderr)
    assert got["mde"] == pytest.approx((t + stats.t.ppf(0.80, x.size - 2)) * ref.stderr)


def test_slope_ci_without_spread_is_none_not_a_crash():
    assert slope_ci([1.0, 1.0, 1.0], [0.1, 0.2, 0.3])["mean"] is None  # one size only: no slope
    two = slope_ci([0.0, 1.0], [0.0, 0.5])
    assert two["mean"] == pytest.approx(0.5) and two["lo"] is None  # a line through 2 points has no error estimate
    assert claims.verdict(slope_ci([], [])) == claims.UNTESTED


def test_the_three_sizes_differ_only_in_width_and_roughly_quadruple():
    assert set(SIZE_SERIES) <= set(TESTBED_PRESETS) | {"default"}
    cfgs = {s: TestbedConfig.named(s) for s in SIZE_SERIES}
    base = cfgs["default"].to_dict()
    for s, c in cfgs.items():
        diff = {k for k, v in c.to_dict().items() if v != base[k]}
        assert diff <= {"hidden_size", "intermediate_size", "warmstart_lr"}, (s, diff)
        assert c.warmstart_lr == (1.5e-3 if s == "large" else 3e-3)
        assert c.intermediate_size == 3 * c.hidden_size
    p = [size_series.n_params(s) for s in SIZE_SERIES]
    assert p[0] < p[1] < p[2]
    assert 0.08e6 < p[0] < 0.15e6 and 0.35e6 < p[1] < 0.5e6 and 1.5e6 < p[2] < 2.5e6
    assert [c.cache_key() for c in cfgs.values()] == list(dict.fromkeys(c.cache_key() for c in cfgs.values()))
    assert cfgs["default"].cache_key() == TestbedConfig().cache_key()  # the default's cached warm starts stay valid


def _fake_size_reports(root, gains, n_params=(100_000, 400_000, 1_600_000)):
    """Per-size runs.csv / results.json as `compare` writes them: GRPO at 0.2, paper at 0.2 + gain."""
    for size, g, p in zip(SIZE_SERIES, gains, n_params):
        d = root / size
        d.mkdir(parents=True)
        with open(d / "runs.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["arm", "seed", "acc_sampled"])
            for seed, gi in enumerate(g):
                w.writerow(["grpo", seed, 0.2])
                w.writerow(["paper", seed, 0.2 + gi])
        warm = {str(s): {"pass_rate": 0.1 + 0.01 * s, "n_params": p} for s in range(len(g))}
        (d / "results.json").write_text(json.dumps({"warm_starts": warm, "command": f"grpo-replay compare --testbed {size}",
                                                    "run_commits": {"0ld0ld0": 2 * len(g)}}))


def test_series_report_by_hand(tmp_path):
    gains = [[0.00, 0.01, -0.01], [0.01, 0.02, 0.00], [0.03, 0.04, 0.02]]  # means 0, 1, 3 pp at x = log4(p) = 8.3, 9.3, 10.3
    _fake_size_reports(tmp_path, gains)
    res = size_series.build_series_report(tmp_path, "grpo-replay compare --size-series", "paper")
    rows = {r["size"]: r for r in res["sizes"]}
    assert rows["small"]["gain"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert rows["large"]["gain"]["mean"] == pytest.approx(0.03)
    assert rows["default"]["n_params"] == 400_000  # the runs' own count, not the named config's
    assert rows["small"]["warm_start_pass_rate"]["max"] == pytest.approx(0.12)
    # Points (log4 p, gain): slope of the means 0 -> 1 -> 3 pp over x steps of exactly 1.
    assert res["trend"]["mean"] == pytest.approx(0.015)
    assert res["trend"]["lo"] > 0 and res["claim"]["verdict"] == claims.HOLDS
    md = (tmp_path / "report.md").read_text()
    assert "grpo-replay compare --size-series" in md and "**holds**" in md and "gain_vs_size.png" in md
    assert res["run_commits"] == {"0ld0ld0": 18}  # 3 sizes x 3 seeds x 2 arms, made by other code than the report's
    assert "Its runs were made at commit `0ld0ld0` (18 runs)" in md
    assert (tmp_path / "gain_vs_size.png").stat().st_size > 1000
    with open(tmp_path / "size_series.csv") as f:
        assert len(list(csv.DictReader(f))) == 9


def test_a_gain_that_shrinks_with_size_does_not_hold(tmp_path):
    _fake_size_reports(tmp_path, [[0.03, 0.02], [0.01, 0.02], [0.0, -0.01]])
    res = size_series.build_series_report(tmp_path, "cmd")
    assert res["trend"]["mean"] < 0 and res["claim"]["verdict"] == claims.FAILS


def test_size_series_refuses_flags_it_sets_itself(tmp_path, capsys):
    for argv in (["--quick"], ["--testbed", "reasoning"], ["--comparisons", "tau_max"], ["--model", "m.gguf"]):
        assert main(["compare", "--size-series", "--out", str(tmp_path), "--dry-run", *argv]) == 2
        assert "--size-series" in capsys.readouterr().err


def test_bad_input_fails_once_before_any_size_runs(tmp_path, capsys):
    for argv in (["--seeds", "0"], ["--arms", "nope"], ["--set", "nope=1"]):
        assert main(["compare", "--size-series", "--out", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("grpo-replay compare: ") == 1 and "size default" not in err, err
    assert not (tmp_path / "report").exists() and not (tmp_path / "small" / "runs").exists()


def test_dry_run_plans_every_size(tmp_path, capsys):
    assert main(["compare", "--size-series", "--seeds", "2", "--out", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    for size in SIZE_SERIES:
        assert f"{tmp_path / size}/runs/grpo/seed1-" in out and f"{tmp_path / size}/runs/paper/seed0-" in out
    assert out.count("todo") == 3 * 2 * 2


@pytest.mark.slow
def test_a_real_series_end_to_end(tmp_path, capsys):
    """Three real (tiny-budget) compares through the command, then the series report from their files."""
    budget = ["--set", "steps=2", "--set", "prompts_per_step=4", "--set", "group_size=4", "--set", "eval_every=2",
              "--set", "eval_problems=8", "--set", "eval_samples=2", "--set", "checkpoint_every=0",
              "--set", "testbed.num_layers=1", "--set", "testbed.warmstart_max_steps=4",
              "--set", "testbed.warmstart_min_steps=0", "--set", "testbed.warmstart_eval_every=2",
              "--set", "testbed.warmstart_eval_problems=8", "--set", "testbed.max_new_tokens=8"]
    out = tmp_path / "series"
    rc = main(["compare", "--size-series", "--seeds", "1", "--jobs", "2", "--out", str(out), "--no-progress",
               "--cache-dir", str(tmp_path / "cache"), *budget])
    assert rc == 0, capsys.readouterr().err
    res = json.loads((out / "report" / "size_series.json").read_text())
    ps = [r["n_params"] for r in res["sizes"]]
    assert ps[0] < ps[1] < ps[2]  # one layer each, so fewer than the named configs', but still ordered by width
    assert all(r["seeds"] == [0] for r in res["sizes"])
    for size in SIZE_SERIES:
        sub = json.loads((out / "report" / size / "results.json").read_text())
        assert f"--testbed {size}" in sub["command"] and "--arms paper" in sub["command"]
    assert res["trend"]["n"] == 3 and res["trend"]["mean"] is not None
    assert res["claim"]["verdict"] in (claims.HOLDS, claims.WEAK, claims.FAILS)


def test_size_series_refuses_a_set_testbed_preset_naming_it(tmp_path, capsys):
    assert main(["compare", "--size-series", "--set", "testbed_preset=large", "--out", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "it cannot go with --set testbed_preset=..." in err and "--testbed small" not in err


def test_a_second_series_into_one_out_is_refused_while_the_first_holds_it(tmp_path, capsys):
    from grpo_replay.trainer.rundir import exclusive

    out = tmp_path / "series"
    with exclusive(out, ".grpo-replay-size-series.lock", "grpo-replay compare --size-series"):  # the first series
        assert main(["compare", "--size-series", "--seeds", "1", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{out} is in use by another grpo-replay compare --size-series (pid " in err
    assert sorted(p.name for p in out.iterdir()) == [".grpo-replay-size-series.lock"]  # no size was started
