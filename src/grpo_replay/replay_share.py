"""The replay share of a step after an engine's cut: a thin delegate to `step_plan` (the one plan every trainer and
the preflight call), kept for code that imports these names."""
from __future__ import annotations

from .composition import PLANNED_ROWS
from .config import ReplayConfig
from .step_plan import StepPlan, plan_step

Share = StepPlan


def planned_rows(fresh: int, cfg: ReplayConfig) -> tuple[int, int]:
    """(fresh rows kept, replay rows asked for) of one step with `fresh` fresh rows: the composition's own count
    (`composition.PLANNED_ROWS`; replay_ratio 0 asks for none)."""
    return PLANNED_ROWS.get(cfg.composition)(fresh, cfg.replay_ratio)


def realised_share(fresh: int, cfg: ReplayConfig, unit: int, group_size: int = 1) -> StepPlan:
    """`step_plan.plan_step(fresh, cfg, unit, group_size=group_size)`."""
    return plan_step(fresh, cfg, unit, group_size=group_size)
