"""The paper's claims, each checked on the testbed with paired (same-seed) 95 % confidence intervals.

Every paired difference also carries its minimum detectable effect ("mde", `stats.mde`: the true difference the
setting's seeds would detect at 95 % with 80 % power, (t_{0.975,n-1} + t_{0.80,n-1}) * sd_diff / sqrt(n)); the evidence
shows it beside the CI, so a "not significant" verdict can be read against the effect the setting could have seen.

A verdict is one of: "holds" (difference in the claimed direction, CI excludes 0); "direction agrees, not
significant" (CI includes 0); "does not hold" (mean difference in the other direction or zero, within TOL); "not tested"
(an arm is missing, e.g. in the quick setting).
"""
from __future__ import annotations

import math
from ..eval.metrics import relative_change
from .stats import Run, format_ci, paired_ci, paired_diff

HOLDS = "holds"
WEAK = "direction agrees, not significant"
FAILS = "does not hold"
UNTESTED = "not tested"


# Differences within TOL of 0 count as 0. The mean of paired differences is a float: equal accuracies can come out
# as 5.55e-18. A real difference is at least 1 / (problems x samples x seeds), many orders of magnitude above TOL.
TOL = 1e-9


def verdict(d: dict, sign: int = 1) -> str:
    """Verdict for the claim sign * difference > 0, given the paired-difference CI d."""
    if not d or d.get("mean") is None:
        return UNTESTED
    m = sign * d["mean"]
    if m <= TOL:
        return FAILS
    if d.get("lo") is None:
        return WEAK
    lo = min(sign * d["lo"], sign * d["hi"])
    return HOLDS if lo > TOL else WEAK


def combine(vs: list[str]) -> str:
    if UNTESTED in vs:
        return UNTESTED
    if FAILS in vs:
        return FAILS
    return WEAK if WEAK in vs else HOLDS


def pp(d: dict) -> str:
    """A paired difference of accuracies in percentage points with its CI, seeds and MDE."""
    return format_ci(d, fmt="{:+.1f}", unit=" pp", n=True, show_mde=True)


def pct(d: dict) -> str:
    """A paired relative change in % with its CI and MDE."""
    return format_ci(d, fmt="{:+.1f}", unit=" %", show_mde=True)


def _acc(r: Run, key: str = "acc_sampled") -> float:
    return r.final[key]


def check_claims(runs: dict[str, list[Run]]) -> list[dict]:
    """One entry per claim: {"claim", "verdict", "evidence": [str], "numbers": {...}}."""
    arms = _Arms(runs)
    return [check(arms) for check in CLAIM_CHECKS]


class _Arms:
    """The runs by arm name, and the two questions every claim asks of them."""

    def __init__(self, runs: dict[str, list[Run]]):
        self.runs = runs

    def have(self, *names: str) -> bool:
        return all(self.runs.get(n) for n in names)

    def diff(self, a: str, b: str, key: str = "acc_sampled") -> dict:
        """Paired (by seed) difference a - b of the final accuracy `key`, with its CI."""
        return paired_diff(self.runs[a], self.runs[b], lambda r: _acc(r, key))


def _claim(text: str) -> dict:
    return {"claim": text, "evidence": [], "numbers": {}}


def _priority(arms: _Arms) -> dict:
    c = _claim("Priority: |A_i| > sigma_g > uniform")
    if arms.have("paper", "prio_sigma", "prio_uniform"):
        d1, d2 = arms.diff("paper", "prio_sigma"), arms.diff("prio_sigma", "prio_uniform")
        v1, v2 = verdict(d1), verdict(d2)
        c["verdict"] = combine([v1, v2])
        c["numbers"] = {"abs_adv_minus_sigma": d1, "sigma_minus_uniform": d2}
        c["evidence"] += [
            f"rollout level, fresh-anchored: |A| - sigma_g = {pp(d1)} ({v1}); sigma_g - uniform = {pp(d2)} ({v2})",
        ]
    else:
        c["verdict"] = UNTESTED
    if arms.have("paper", "sigma_pool", "uniform_pool"):
        d3, d4 = arms.diff("paper", "sigma_pool"), arms.diff("sigma_pool", "uniform_pool")
        c["numbers"].update(paper_minus_sigma_pool=d3, sigma_pool_minus_uniform_pool=d4)
        c["evidence"].append(
            f"naive query-level pool baselines: paper - sigma_g-pool = {pp(d3)} ({verdict(d3)}); "
            f"sigma_g-pool - uniform-pool = {pp(d4)} ({verdict(d4)})"
        )
    return c


def _composition(arms: _Arms) -> dict:
    c = _claim("Composition: fresh-anchored > pool")
    if arms.have("paper", "comp_pool"):
        d = arms.diff("paper", "comp_pool")
        c.update(verdict=verdict(d), numbers={"fresh_anchored_minus_pool": d})
        c["evidence"].append(f"fresh-anchored - pool (both |A|, rollout level) = {pp(d)}")
        if arms.have("grpo"):
            d2 = arms.diff("comp_pool", "grpo")
            c["numbers"]["pool_minus_grpo"] = d2
            c["evidence"].append(f"pool - GRPO = {pp(d2)} (the paper saw pool fall below GRPO at 4B)")
    else:
        c["verdict"] = UNTESTED
    return c


def _age_eviction(arms: _Arms) -> dict:
    c = _claim("Age eviction: a moderate tau_max is best (larger tau_max degrades)")
    taus = {n: t for n, t in (("tau1", 1), ("tau2", 2), ("tau5", 5), ("paper", 10), ("tau20", 20), ("tau_none", math.inf))}
    present = {n: t for n, t in taus.items() if arms.runs.get(n)}
    if not (len(present) >= 3 and "tau1" in present and "tau_none" in present):
        c["verdict"] = UNTESTED
        return c
    means = {n: sum(_acc(r) for r in arms.runs[n]) / len(arms.runs[n]) for n in present}
    best = max(means, key=means.get)
    c["numbers"]["mean_acc_by_tau"] = {str(present[n]): means[n] for n in present}
    c["numbers"]["best_tau"] = str(present[best])
    c["evidence"].append(
        "final sampled accuracy by tau_max: "
        + ", ".join(f"{present[n]:g}: {100 * means[n]:.1f} %" for n in sorted(present, key=present.get))
    )
    if best in ("tau1", "tau_none"):
        c["verdict"] = FAILS
        c["evidence"].append(f"the best tau_max is an extreme ({present[best]:g})")
    else:
        d_lo, d_hi = arms.diff(best, "tau1"), arms.diff(best, "tau_none")
        c["numbers"].update(best_minus_tau1=d_lo, best_minus_none=d_hi)
        c["verdict"] = combine([verdict(d_lo), verdict(d_hi)])
        c["evidence"].append(
            f"best tau_max = {present[best]:g}: best - tau_max=1 = {pp(d_lo)}; best - no eviction = {pp(d_hi)}"
        )
    if "tau20" in present and "paper" in present:
        d = arms.diff("paper", "tau20")
        c["numbers"]["tau10_minus_tau20"] = d
        c["evidence"].append(f"tau_max 10 - 20 = {pp(d)} (larger tau_max degrades: {verdict(d)})")
    return c


def _length(arms: _Arms) -> dict:
    c = _claim("Length: correct responses longer, incorrect ones shorter than GRPO's")
    if arms.have("paper", "grpo"):
        rel = {}
        for key in ("len_correct", "len_incorrect"):
            bs = {r.seed: r for r in arms.runs["grpo"]}
            rel[key] = paired_ci([relative_change(r.final.get(key), bs[r.seed].final.get(key)) for r in arms.runs["paper"] if r.seed in bs])
        v1, v2 = verdict(rel["len_correct"]), verdict(rel["len_incorrect"], sign=-1)
        c.update(verdict=combine([v1, v2]), numbers={"len_correct_rel": rel["len_correct"], "len_incorrect_rel": rel["len_incorrect"]})
        c["evidence"].append(
            f"paper vs GRPO, paired relative change: correct {pct(rel['len_correct'])} ({v1}); "
            f"incorrect {pct(rel['len_incorrect'])} ({v2}) (paper at 4B: +34.9 % / -10.2 %)"
        )
    else:
        c["verdict"] = UNTESTED
    return c


def _replay_beats_grpo(arms: _Arms) -> dict:
    c = _claim("Replay (the paper's method) beats GRPO")
    if arms.have("paper", "grpo"):
        d, g = arms.diff("paper", "grpo"), arms.diff("paper", "grpo", "acc_greedy")
        c.update(verdict=verdict(d), numbers={"sampled": d, "greedy": g})
        c["evidence"].append(f"same generation budget: sampled mean@n {pp(d)}; greedy {pp(g)} ({verdict(g)})")
        if arms.have("grpo_cm"):
            d2 = arms.diff("paper", "grpo_cm")
            c["numbers"]["vs_compute_matched"] = d2
            c["evidence"].append(
                f"vs compute-matched GRPO (same update rows, 1.5x the generated rollouts): {pp(d2)} ({verdict(d2)})"
            )
    else:
        c["verdict"] = UNTESTED
    return c


# The paper's claims, in the report's order; each check reads the runs it needs and is UNTESTED without them.
CLAIM_CHECKS = (_priority, _composition, _age_eviction, _length, _replay_beats_grpo)
