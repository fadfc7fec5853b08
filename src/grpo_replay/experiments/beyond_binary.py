"""The arms and comparisons beyond the paper's stated limits (docs/results/PLAN.md, section I): a graded reward,
and binary rewards under RLOO and Dr. GRPO advantages.

Each arm is an existing arm (`grpo`, `paper`, `prio_uniform`, `fill`) with one setting added: the graded reward
(`GRADED`), or the advantage estimator. The arm without replay of each family is its reference (`Comparison
.reference`): the target its replay arms are read against on the three axes (generated rollouts, update row-passes,
training time), as in sections G and H.
"""
from __future__ import annotations

GRADED = {"reward_funcs": ["correct", "digits", "format"], "reward_weights": [1.0, 0.5, 0.1]}
"""The graded reward: 1 for the right answer, plus 0.5 x the share of its digits right, plus 0.1 for a well-formed
answer (a right answer scores 1.6, a well-formed wrong one 0.1 to 0.6, a malformed one 0)."""
RLOO = {"advantage_estimator": "rloo"}
DR_GRPO = {"advantage_scale": "none"}

# family -> (its name prefix, what it adds to every arm, the label's suffix)
FAMILIES = {
    "graded": ("graded", GRADED, "graded reward"),
    "rloo": ("rloo", RLOO, "RLOO advantages"),
    "dr_grpo": ("drgrpo", DR_GRPO, "Dr. GRPO advantages (unscaled)"),
}
# arm suffix -> (its base arm's overrides, label); the graded family has all four, the estimator families two
BASES = {
    "grpo": ({"preset": "grpo"}, "GRPO (no replay)"),
    "paper": ({"preset": "paper"}, "paper"),
    "uniform": ({"preset": "paper", "replay.priority": "uniform"}, "paper, uniform priority"),
    "fill": ({"preset": "paper", "replay.fill_filtered": True}, "paper + fill_filtered"),
}
FAMILY_ARMS = {"graded": ("grpo", "paper", "uniform", "fill"), "rloo": ("grpo", "paper"), "dr_grpo": ("grpo", "paper")}
PARENT = {"grpo": "grpo", "paper": "paper", "uniform": "prio_uniform", "fill": "fill"}
"""The existing arm (experiments/arms.py) each suffix adds its family's setting to."""


def arm_name(family: str, base: str) -> str:
    return f"{FAMILIES[family][0]}_{base}"


def beyond_arms(arm_cls) -> list:
    """The section's arms (`arm_cls` is arms.Arm; passed in to keep this module free of an import cycle)."""
    out = []
    for family, bases in FAMILY_ARMS.items():
        _, adds, suffix = FAMILIES[family]
        for base in bases:
            overrides, label = BASES[base]
            out.append(arm_cls(arm_name(family, base), f"{label}, {suffix}", {**overrides, **adds}))
    return out


NO_REPLAY = tuple(arm_name(f, "grpo") for f in FAMILIES)
"""The section's arms without replay: the alternatives (and references) of its comparisons."""
ARM_NAMES = tuple(arm_name(f, b) for f, bases in FAMILY_ARMS.items() for b in bases)


def beyond_comparisons(comparison_cls) -> list:
    """The section's comparisons (`comparison_cls` is arms.Comparison): each family's arms, its arm without replay
    as the fixed reference, and the pre-registered pairs."""
    g, r, d = (lambda b: arm_name("graded", b)), (lambda b: arm_name("rloo", b)), (lambda b: arm_name("dr_grpo", b))
    return [
        comparison_cls(
            "graded", "Graded reward (correct + 0.5 digits + 0.1 format)", ("grpo", *(g(b) for b in FAMILY_ARMS["graded"])),
            "With a graded reward, whose groups are rarely all equal, does the paper's replay still beat GRPO, does "
            "its |A| priority still beat uniform, and does fill_filtered still add anything?",
            reference=g("grpo"),
            pairs=((g("paper"), g("grpo")), (g("paper"), g("uniform")), (g("fill"), g("grpo")), (g("fill"), g("paper"))),
        ),
        comparison_cls(
            "rloo", "Binary reward, RLOO advantages", ("grpo", r("grpo"), r("paper")),
            "Under RLOO's leave-one-out baseline, does the paper's replay beat the same estimator without replay?",
            reference=r("grpo"), pairs=((r("paper"), r("grpo")),),
        ),
        comparison_cls(
            "dr_grpo", "Binary reward, Dr. GRPO advantages", ("grpo", d("grpo"), d("paper")),
            "Under Dr. GRPO's unscaled advantages, does the paper's replay beat the same estimator without replay?",
            reference=d("grpo"), pairs=((d("paper"), d("grpo")),),
        ),
    ]
