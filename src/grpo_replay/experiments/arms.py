"""The arms of `grpo-replay compare`, the comparisons that group them, and the quick / full settings.

An arm is a name plus the TrainConfig overrides that define it. Every arm except the compute-matched GRPO runs at
the same generation budget (same fresh prompts x group size per step, same steps). Ablations change one axis of
the paper's method at a time; the arm that equals the paper's method on that axis *is* the `paper` arm (its runs
are shared, not repeated).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from ..tasks.testbed.testbed_config import TINY_TESTBED  # noqa: F401  (re-exported: the quick setting uses it)
from .beyond_binary import beyond_arms, beyond_comparisons


BASE = "grpo"
"""The arm every other arm is compared with (paired over seeds)."""


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    overrides: dict = field(default_factory=dict, hash=False)
    same_budget: bool = True
    """False for arms that generate more rollouts per step than the rest (the compute-matched GRPO)."""
    tau: Optional[float] = None
    """x position on the tau_max curve (None = not on it; inf = no age eviction)."""


def make_arms(setting: "Setting") -> dict[str, Arm]:
    """All arms, keyed by name. The compute-matched arm depends on the setting's prompts_per_step."""
    ppp = int(setting.overrides["prompts_per_step"])
    ratio = float(setting.overrides.get("replay.replay_ratio", 0.5))
    cm_prompts = int(round(ppp * (1.0 + ratio)))
    arms = [
        Arm("grpo", "GRPO (no replay)", {"preset": "grpo"}),
        Arm("uniform_pool", "uniform-pool (query level)", {"preset": "uniform_pool"}),
        Arm("sigma_pool", "sigma_g-pool (query level)", {"preset": "sigma_pool"}),
        Arm("paper", "paper: |A| + fresh-anchored + tau_max=10", {"preset": "paper"}, tau=10),
        Arm("tau1", "tau_max=1", {"preset": "paper", "replay.tau_max": 1}, tau=1),
        Arm("tau2", "tau_max=2", {"preset": "paper", "replay.tau_max": 2}, tau=2),
        Arm("tau5", "tau_max=5", {"preset": "paper", "replay.tau_max": 5}, tau=5),
        Arm("tau20", "tau_max=20", {"preset": "paper", "replay.tau_max": 20}, tau=20),
        Arm("tau_none", "tau_max=none (no age eviction)", {"preset": "paper", "replay.tau_max": None}, tau=float("inf")),
        Arm("comp_pool", "pool composition (|A|, rollout level)", {"preset": "paper", "replay.composition": "pool"}),
        Arm("prio_sigma", "sigma_g priority (fresh-anchored, rollout level)", {"preset": "paper", "replay.priority": "group_std"}),
        Arm("prio_uniform", "uniform priority (fresh-anchored, rollout level; = alpha 0)", {"preset": "paper", "replay.priority": "uniform"}),
        Arm("alpha1", "alpha=1 (proportional to |A|)", {"preset": "paper", "replay.alpha": 1.0}),
        *option_arms(),
        *alternative_arms(setting.dapo_eval_every),
        *dapo_budget_arms(setting.long_steps, setting.long_eval_every, setting.dapo_eval_every),
        *beyond_arms(Arm),
        Arm(
            "grpo_cm",
            f"compute-matched GRPO ({cm_prompts} prompts/step = (1 + replay_ratio) x {ppp})",
            {"preset": "grpo", "prompts_per_step": cm_prompts},
            same_budget=False,
        ),
    ]
    return {a.name: a for a in arms}


# The options beyond the paper (docs/method.md), each added to the paper's method alone; the pilot tries these values
# on seeds kept apart from the report's, and the `options` comparison keeps one per option.
OPTION_VALUES = {
    "max_drift": (0.1, 0.3),
    "fill_filtered": (True,),
    "max_uses": (1, 3),
    "age_decay": (3.0, 10.0),
}
_OPTION_SHORT = {"max_drift": "drift", "fill_filtered": "fill", "max_uses": "uses", "age_decay": "decay"}


def option_arm_name(option: str, value) -> str:
    return _OPTION_SHORT[option] + ("" if value is True else f"{value:g}")


def option_arms() -> list[Arm]:
    return [
        Arm(option_arm_name(o, v), f"paper + {o}={v}", {"preset": "paper", f"replay.{o}": v})
        for o, values in OPTION_VALUES.items() for v in values
    ]


# The value of each option the `options` comparison runs, chosen on the pilot (docs/results/PLAN.md, section F).
OPTIONS_CHOSEN = ("drift0.3", "fill", "uses3", "decay10")


DAPO_EVAL_EVERY = 10
"""Steps between the DAPO arms' held-out evaluations: about 4 generation rounds a step on the default testbed (3 of 4
groups have zero variance there), so 10 steps are about as many rollouts as 50 steps of the other arms."""


def alternative_arms(dapo_eval_every: int = DAPO_EVAL_EVERY) -> list[Arm]:
    """What a user would try instead of replay to get more out of each generated rollout (docs/method.md,
    "Baselines without replay"): more updates per generation batch (mu, `update_epochs`) and DAPO's dynamic
    sampling; and the paper's method + fill_filtered with mu = 2. DAPO generates more rollouts per step than
    the rest (the rounds it needs), so it is not at the same budget per step: read it on the generated axis. It
    evaluates every DAPO_EVAL_EVERY steps, so that its curve has about as many points per generated rollout as
    the others' at eval_every=50 (evaluation forks the random generators: the training run is the same)."""
    dapo = {"preset": "grpo", "dynamic_sampling": True, "eval_every": dapo_eval_every}
    return [
        Arm("grpo_mu2", "GRPO, mu=2 updates per batch", {"preset": "grpo", "update_epochs": 2}),
        Arm("grpo_mu4", "GRPO, mu=4 updates per batch", {"preset": "grpo", "update_epochs": 4}),
        Arm("dapo", "DAPO dynamic sampling (GRPO, up to 10 generation rounds)", dapo, same_budget=False),
        Arm("dapo_r3", "DAPO dynamic sampling (GRPO, up to 3 generation rounds)", {**dapo, "max_generation_rounds": 3},
            same_budget=False),
        Arm("fill_mu2", "paper + fill_filtered, mu=2", {"preset": "paper", "replay.fill_filtered": True, "update_epochs": 2}),
    ]


LONG_STEPS = 2000
"""Steps of the arms continued to DAPO's budget (docs/results/PLAN.md, section H): 2000 x 128 = 256,000 generated
rollouts, above every seed's budget of DAPO's 300-step runs (141k-246k on the default testbed, mean 195.5k), so
whether an arm reaches DAPO's final accuracy within DAPO's own budget is answered on every seed."""
CAPPED_ROUNDS = 2
"""The round cap of `fill_r2`: dynamic sampling for at most this many generation rounds, then fill from the buffer."""


def dapo_budget_arms(long_steps: int = LONG_STEPS, eval_every: int = 50,
                     dapo_eval_every: int = DAPO_EVAL_EVERY) -> list[Arm]:
    """Replay at DAPO's budget and replay with DAPO (PLAN.md, section H). The `_long` arms are `grpo`, `paper` and
    `fill` run for LONG_STEPS steps, evaluated every 50 steps as before (6,400 rollouts, DAPO's every 10 steps is
    about 6,500): each continues its 300-step run in the same --out (`continuation.py`). `dapo_paper` is DAPO's
    dynamic sampling with the paper's replay at DAPO's own 300 steps. `fill_r2` resamples up to CAPPED_ROUNDS rounds,
    then fills the shortfall from the buffer; about CAPPED_ROUNDS x 128 rollouts a step, so it runs
    LONG_STEPS / CAPPED_ROUNDS steps (the same generated budget) and evaluates every 50 / CAPPED_ROUNDS steps. A
    setting of few steps (quick) gives its own `long_steps`, the other arms' `eval_every` and DAPO's."""
    long = {"steps": long_steps}
    fill = {"preset": "paper", "replay.fill_filtered": True}
    return [
        Arm("grpo_long", f"GRPO, {long_steps} steps", {"preset": "grpo", **long}, same_budget=False),
        Arm("paper_long", f"paper, {long_steps} steps", {"preset": "paper", **long}, same_budget=False),
        Arm("fill_long", f"paper + fill_filtered, {long_steps} steps", {**fill, **long}, same_budget=False),
        Arm("dapo_paper", "DAPO dynamic sampling + the paper's replay (up to 10 rounds)",
            {"preset": "paper", "dynamic_sampling": True, "eval_every": dapo_eval_every}, same_budget=False),
        Arm(f"fill_r{CAPPED_ROUNDS}", f"paper + fill_filtered after up to {CAPPED_ROUNDS} generation rounds, "
            f"{long_steps // CAPPED_ROUNDS} steps",
            {**fill, "dynamic_sampling": True, "max_generation_rounds": CAPPED_ROUNDS,
             "steps": long_steps // CAPPED_ROUNDS, "eval_every": max(1, eval_every // CAPPED_ROUNDS)},
            same_budget=False),
    ]


# The arms of the `alternatives` comparison, fixed before its pilot (docs/results/PLAN.md, section G): the pilot may
# drop grpo_mu4 and fill_mu2 and may swap dapo for dapo_r3 by the rules written there, never add an arm. The pilot
# (docs/results/alternatives-pilot, seeds 12-13) dropped grpo_mu4 and fill_mu2 and kept dapo's cap of 10.
ALTERNATIVES_CHOSEN = ("grpo_mu2", "dapo", "paper", "fill")


@dataclass(frozen=True)
class Comparison:
    name: str
    title: str
    arms: tuple[str, ...]
    question: str
    reference: Optional[str] = None
    """The arm whose final accuracy is each seed's target on the three axes (`alternatives.py`); None: the best
    arm without replay. Fixed in advance where the question names it (DAPO at its budget)."""
    pairs: tuple[tuple[str, str], ...] = ()
    """Pre-registered paired differences a - b: on the three axes (beyond every replay arm minus every arm without
    replay) in a comparison `on_axes`, else of the final accuracy with the seeds their half-width needs
    (`contrasts.py`)."""

    @property
    def on_axes(self) -> bool:
        """Whether the section adds the three axes (generated rollouts, update row-passes, training time)."""
        return self.name.startswith("alternatives") or self.reference is not None


COMPARISONS: dict[str, Comparison] = {
    c.name: c
    for c in [
        Comparison(
            "main", "Main arms (the paper's headline table)", ("grpo", "uniform_pool", "sigma_pool", "paper"),
            "Does the paper's method beat plain GRPO and the naive query-level replay baselines?",
        ),
        Comparison(
            "tau_max", "Age eviction: tau_max", ("grpo", "tau1", "tau2", "tau5", "paper", "tau20", "tau_none"),
            "Is a moderate maximum age best?",
            pairs=(("paper", "tau1"), ("paper", "tau_none")),
        ),
        Comparison(
            "composition", "Composition (|A| priority, rollout level)", ("grpo", "paper", "comp_pool"),
            "Fresh-anchored (concatenate) vs pool (replay displaces fresh rows).",
            pairs=(("paper", "comp_pool"),),
        ),
        Comparison(
            "priority", "Priority (fresh-anchored, rollout level)", ("grpo", "paper", "prio_sigma", "prio_uniform"),
            "|A_i| vs sigma_g vs uniform.",
            pairs=(("paper", "prio_sigma"), ("paper", "prio_uniform")),
        ),
        Comparison(
            "compute", "Replay vs generating more (compute-matched GRPO)", ("grpo", "paper", "grpo_cm"),
            "Is replay better than a GRPO whose fresh batch is (1 + replay_ratio) times larger, so it updates on as "
            "many rows? grpo_cm generates more rollouts: compare it at equal update rows (equal steps) and read "
            "the generated-rollouts axis honestly.",
        ),
        Comparison(
            "options_pilot", "Options beyond the paper: pilot values",
            ("grpo", *(option_arm_name(o, v) for o, vs in OPTION_VALUES.items() if len(vs) > 1 for v in vs)),
            "Which value of each option to carry into the options comparison (pilot seeds only).",
        ),
        Comparison(
            "options", "Options beyond the paper, one value each", ("grpo", "paper", *OPTIONS_CHOSEN),
            "Does an option added to the paper's method reach GRPO's accuracy with fewer generated rollouts?",
        ),
        Comparison(
            "alternatives_pilot", "Replay vs more updates per batch and dynamic sampling: pilot",
            ("grpo", "grpo_mu2", "grpo_mu4", "dapo", "dapo_r3", "fill", "fill_mu2"),
            "Which mu, which round cap and whether fill_filtered + mu=2 go into the alternatives comparison (pilot seeds).",
        ),
        Comparison(
            "alternatives", "Replay vs what a user would pick instead", ("grpo", *ALTERNATIVES_CHOSEN),
            "Does replay (+ fill_filtered) beat more updates per generation batch and DAPO's dynamic sampling on "
            "generated rollouts, update rows and training time, each at its own budget?",
        ),
        Comparison(
            "dapo_budget", "Replay continued to DAPO's generated-rollout budget",
            ("grpo", "dapo", "grpo_long", "paper_long", "fill_long"),
            "Given as many generated rollouts as DAPO's 300 steps, where does each replay arm reach DAPO's final "
            "accuracy, and which arm is ahead at each budget in rollouts, update row-passes and training time?",
            reference="dapo",
        ),
        Comparison(
            "with_dapo", "Replay with DAPO's dynamic sampling",
            ("grpo", "dapo", "paper_long", "fill_long", "dapo_paper", f"fill_r{CAPPED_ROUNDS}"),
            "Does the paper's replay add to DAPO at DAPO's budget, and does resampling up to "
            f"{CAPPED_ROUNDS} rounds then filling from the buffer beat both of its parents (DAPO, fill_filtered) on "
            "some axis?",
            reference="dapo",
            pairs=(("dapo_paper", "paper_long"), (f"fill_r{CAPPED_ROUNDS}", "fill_long")),
        ),
        *beyond_comparisons(Comparison),
        Comparison(
            "alpha", "Priority exponent alpha (uniform priority = alpha 0)", ("grpo", "prio_uniform", "paper", "alpha1"),
            "How sharp should the |A| priority be?",
        ),
    ]
}

# Order in which comparisons are scheduled (and dropped first when --comparisons is narrowed): alpha last.
PRIORITY_ORDER = ("main", "tau_max", "composition", "priority", "compute", "options_pilot", "options",
                  "alternatives_pilot", "alternatives", "dapo_budget", "with_dapo", "graded", "rloo", "dr_grpo",
                  "alpha")
PAPER_COMPARISONS = ("main", "tau_max", "composition", "priority", "compute", "alpha")
"""The full setting's default: the paper's comparisons (the options have their own, longer runs: docs/results/PLAN.md)."""


@dataclass(frozen=True)
class Setting:
    name: str
    overrides: dict
    """TrainConfig overrides shared by every run (sizes; the testbed's own defaults otherwise)."""
    seeds: int
    comparisons: tuple[str, ...]
    cache_in_out: bool = False
    """Keep the warm-start cache inside the output directory (the quick setting, so tests stay hermetic)."""
    budgets: int = 3
    """Number of fixed generated-rollout budgets in the tables (evenly spaced eval points, the last included)."""
    only_arms: Optional[tuple[str, ...]] = None
    """Restrict the setting's own comparisons to these arms (the quick setting keeps a few); None = all arms. A
    comparison named with --comparisons runs all its arms (`for_comparisons`)."""
    long_steps: int = LONG_STEPS
    """Steps of the arms continued to DAPO's budget (`dapo_budget_arms`)."""
    long_eval_every: int = 50
    """The long arms' evaluation schedule, which fill_r2's divides by its round cap."""
    dapo_eval_every: int = DAPO_EVAL_EVERY
    """eval_every of the DAPO arms."""

    def for_comparisons(self, named: bool) -> "Setting":
        """The setting for comparisons the user `named` (--comparisons): every arm of each, not only `only_arms`."""
        return dataclasses.replace(self, only_arms=None) if named else self


QUICK = Setting(
    name="quick",
    overrides={
        "steps": 6,
        "prompts_per_step": 8,
        "group_size": 4,
        "eval_every": 3,
        "eval_problems": 16,
        "eval_samples": 4,
        "checkpoint_every": 0,
        "lr": 3e-3,
        "replay.warmup_steps": 2,
        **TINY_TESTBED,
    },
    seeds=2,
    comparisons=("main", "tau_max", "compute"),
    cache_in_out=True,
    budgets=2,
    only_arms=("grpo", "paper", "tau2", "grpo_cm"),
    # the arms at DAPO's budget at quick sizes: twice the 6 steps, evaluated as often as the others
    long_steps=12,
    long_eval_every=3,
    dapo_eval_every=3,
)

FULL = Setting(
    name="full",
    overrides={
        "steps": 80,
        "prompts_per_step": 16,
        "group_size": 8,
        "eval_every": 20,
        "eval_problems": 96,
        "eval_samples": 8,
        "checkpoint_every": 40,
    },
    seeds=5,
    comparisons=PAPER_COMPARISONS,
    budgets=3,
)

SETTINGS = {"quick": QUICK, "full": FULL}

# A real model (`compare --model ...`): the trainer's defaults with the paper's learning rate for 0.6B-4B models and a
# small held-out check during training; the paper's table comes from the benchmark stage (final_eval.py). The
# command adds model, data, reward and backend; --set overrides any of these.
REAL = Setting(
    name="real",
    overrides={
        "reward": "math",
        "lr": 1e-6,
        "steps": 150,
        "prompts_per_step": 32,
        "group_size": 8,
        "eval_every": 50,
        "eval_problems": 64,
        "eval_samples": 4,
        "checkpoint_every": 50,
        "keep_checkpoints": 1,
    },
    seeds=3,
    comparisons=("main",),
    budgets=3,
)


def comparison_arms(name: str, only_arms: Optional[tuple[str, ...]] = None) -> tuple[str, ...]:
    arms = COMPARISONS[name].arms
    return tuple(a for a in arms if only_arms is None or a in only_arms or a == BASE)


def arms_for(comparisons: tuple[str, ...], only_arms: Optional[tuple[str, ...]] = None) -> list[str]:
    """Unique arm names needed by the comparisons, base arm first, in first-use order."""
    out = [BASE]
    for c in comparisons:
        for a in comparison_arms(c, only_arms):
            if a not in out:
                out.append(a)
    return out


def seed_overrides(seed: int) -> dict[str, Any]:
    """Seed i varies the training seed (prompts, generation, buffer, and the eval sampling seed = seed + 777)
    and the warm start (testbed.seed), so the spread over seeds includes the starting model."""
    return {"seed": seed, "testbed.seed": seed}
