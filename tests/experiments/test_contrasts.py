"""Pre-registered contrasts of a comparison: the paired final-accuracy difference, its half-width, and the seeds at
which the half-width would reach the target at the observed spread (the input of PLAN.md section H's seed rule)."""
import math

import pytest
from scipy import stats as sps

from grpo_replay.experiments import contrasts
from grpo_replay.experiments.arms import COMPARISONS
from grpo_replay.experiments.stats import Run, seeds_for_half_width


def _runs(arm, accs):
    return [Run(arm, s, [{"generated": 0, "acc_sampled": 0.1}, {"generated": 100, "acc_sampled": a}], 10, 100)
            for s, a in enumerate(accs)]


def test_seeds_for_a_half_width_is_the_first_n_whose_t_interval_is_narrow_enough():
    for sd in (0.005, 0.0101, 0.014, 0.0176):
        n = seeds_for_half_width(sd, 0.008)
        half = lambda k: sps.t.ppf(0.975, k - 1) * sd / math.sqrt(k)  # noqa: E731
        assert half(n) <= 0.008 and (n == 2 or half(n - 1) > 0.008)
    assert seeds_for_half_width(0.0101, 0.008) == 9 and seeds_for_half_width(0.014, 0.008) == 15
    assert seeds_for_half_width(None, 0.008) is None and seeds_for_half_width(1.0, 0.008, n_max=50) is None


def test_rows_pair_by_seed_and_skip_a_pair_whose_arm_did_not_run():
    runs = {"paper": _runs("paper", [0.30, 0.32, 0.35, 0.31]), "prio_sigma": _runs("prio_sigma", [0.29, 0.30, 0.36, 0.28])}
    rows = contrasts.rows(runs, (("paper", "prio_sigma"), ("paper", "prio_uniform")))
    assert len(rows) == 1
    d = [0.01, 0.02, -0.01, 0.03]
    r = rows[0]
    sd = float(sps.tstd(d))
    assert r["diff"]["mean"] == pytest.approx(sum(d) / 4) and r["diff"]["sd"] == pytest.approx(sd)
    assert r["half_width"] == pytest.approx(sps.t.ppf(0.975, 3) * sd / 2)
    assert r["seeds_for_target"] == seeds_for_half_width(sd, 0.008)
    text = "\n".join(contrasts.markdown(rows, {"paper": "paper"}))
    assert "| paper - prio_sigma | +1.2 [-1.5, +4.0] (n=4, MDE 3.6) | 2.72 |" in text and f"| {r['seeds_for_target']} |" in text


def test_the_mechanism_comparisons_name_the_paper_s_choice_against_each_alternative():
    assert COMPARISONS["priority"].pairs == (("paper", "prio_sigma"), ("paper", "prio_uniform"))
    assert COMPARISONS["composition"].pairs == (("paper", "comp_pool"),)
    assert COMPARISONS["tau_max"].pairs == (("paper", "tau1"), ("paper", "tau_none"))
    assert not any(COMPARISONS[c].on_axes for c in ("priority", "composition", "tau_max"))
