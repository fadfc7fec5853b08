"""The shape of one step: how many fresh and replay rows an engine trains on once the composed batch is fitted to its
unit. Every trainer (through `ReplaySession.compose`), the preflight, TRL's split check and the memory estimate call
this one module, so what a preflight reports is what the launch runs.

An engine trains on the composed rows in equal pieces. Its `Unit` is either a row multiple (TRL sync splits a
process's rows into `steps_per_generation` micro-batches; verl splits over its ranks and mini-batches; the built-in
trainer has 1: nothing is cut) or a fixed total (TRL async packs `per_device x processes x GA` samples a step).

The plan, with a full buffer after warm-up:
1. The composition's own count (`composition.PLANNED_ROWS`): fresh rows kept, replay rows asked for; at group
   granularity the draw gives whole groups of `group_size` rows within that count (341 asked, groups of 8: 336).
2. Where those rows are not a multiple of the unit, the replay count is the one the unit holds nearest to the
   composition's ratio of replay to kept fresh rows (`_nearest`; ties: the fewer rows): TRL's 6 fresh rows in 2
   micro-batches with 3 replay rows planned train 6 + 2. Where that count is zero (one-row micro-batches at ratio
   0.5: 0 or twice the ratio), replay would vanish and the plan says so (`vanishes`); trainers refuse it. A fixed total takes the composition's rule for it
   (`composition.FIXED_ROWS`); a composition without one is refused by name.
3. What the replay count cannot fit is fitted by the one trimming rule (`fit_rows`): replay rows first (the last
   drawn, the lowest priority), then spare rows (zero-variance or engine padding rows: A = 0, on-policy, never
   stored) added, then the fresh rows of smallest |A| left out; where nothing fits, the engine's own batch.
At run time `ReplaySession.compose` asks the buffer for the plan's replay count and fits what the draw gave (fewer
rows in warm-up or from a short buffer) by the same rule, so with a full buffer it trains exactly the plan.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Callable, NamedTuple, Optional

from .composition import FIXED_ROWS, KEPT_ROWS, PLANNED_ROWS
from .config import ReplayConfig
from .errors import ConfigError

__all__ = ["Unit", "StepPlan", "Fit", "plan_step", "fit_rows", "fixed_fresh", "as_unit", "realised"]


@dataclass(frozen=True)
class Unit:
    """How an engine cuts a step: the rows must be a multiple of `multiple`, or exactly `total` (a fixed-size step:
    the fresh rows the plan takes, the replay rows and the fresh rows it adds up to the total)."""

    multiple: int = 1
    total: Optional[int] = None

    def __post_init__(self) -> None:
        if isinstance(self.multiple, bool) or not isinstance(self.multiple, int) or self.multiple < 1:
            raise ValueError(f"Unit: multiple={self.multiple!r} is invalid; allowed: an integer >= 1")
        if self.total is not None and (isinstance(self.total, bool) or not isinstance(self.total, int)
                                       or self.total < 1):
            raise ValueError(f"Unit: total={self.total!r} is invalid; allowed: an integer >= 1 or None")


def as_unit(unit: "int | Unit") -> Unit:
    return unit if isinstance(unit, Unit) else Unit(multiple=int(unit))


class Fit(NamedTuple):
    """How `fit_rows` fitted (kept fresh, replay) rows: replay rows kept, spare rows added, fresh rows left out, and
    `whole`: nothing fits, the engine trains its own batch (every fresh and spare row, no replay: `pad` = spare)."""

    replay: int
    pad: int = 0
    cut: int = 0
    whole: bool = False


@dataclass(frozen=True)
class StepPlan:
    """One step's rows per process. `kept + pad + extra + replay` rows train (`rows`)."""

    fresh: int  # fresh rows handed to the composition
    ask: int  # replay rows asked of the buffer (the composition's own count, or the count fitted to the unit)
    planned: int  # replay rows the composition's own count gives with a full buffer (whole groups)
    kept: int  # fresh rows trained (the composition's kept rows less `cut`)
    replay: int  # replay rows trained
    pad: int = 0  # spare rows trained (zero-variance or engine padding rows)
    cut: int = 0  # fresh rows the composition kept that the fit left out (smallest |A|)
    extra: int = 0  # fresh rows a fixed-total engine adds to reach its total (a short draw)
    unit: int = 1  # the row multiple (1 with a fixed total)
    total: Optional[int] = None  # the fixed total, None for a row multiple
    whole: bool = False  # nothing fits: the engine's own batch
    enabled: bool = True  # replay is on (replay_ratio > 0)
    configured: float = 0.0  # the composition's own share: asked / (its kept + asked)

    @property
    def rows(self) -> int:
        return self.kept + self.pad + self.extra + self.replay

    @property
    def share(self) -> float:
        """Replayed fraction of the step's trained rows: the figure every trainer logs as replay/share."""
        return self.replay / self.rows if self.rows else 0.0

    @property
    def vanishes(self) -> bool:
        """Replay is on but no replay row would train, even from a full buffer: the arm would be GRPO."""
        return self.enabled and self.replay == 0

    @property
    def realised(self) -> bool:
        """Replay reaches the update (or is off): the step is the method it was configured as."""
        return not self.vanishes


def fit_rows(kept: int, replay: int, unit: int, spare: int = 0,
             agree: Optional[Callable[[int], int]] = None) -> Fit:
    """Fit `kept` fresh + `replay` replay rows to a multiple of `unit` by the one trimming rule: drop the last r
    replay rows (r = rows beyond the multiple) while one stays; else add unit - r spare rows; else leave out r rows,
    replay first, then fresh (a replay row stays while a fresh row can go); else the engine's own batch.

    `agree(rows) -> rows`: the smallest row count over processes (TRL's collective); each process first drops to
    it (replay first), then every process applies the rule to the same count, only ever dropping (spare rows are
    not used: processes could not all add them)."""
    cut = 0
    if agree is not None:
        target = int(agree(kept + replay))
        over = kept + replay - target
        if over < 0:
            raise ValueError(f"fit_rows: agree returned {target} rows, more than this process's {kept + replay}")
        drop = min(over, replay)
        replay, cut, kept, spare = replay - drop, over - drop, kept - (over - drop), 0
    total = kept + replay
    if total == 0:
        return Fit(0, spare, cut, whole=True) if agree is None else Fit(0, 0, cut)
    r = total % unit
    if r == 0:
        return Fit(replay, 0, cut)
    if replay > r:
        return Fit(replay - r, 0, cut)
    if spare >= unit - r:
        return Fit(replay, unit - r, cut)
    if total - r > 0:
        if replay > 0 and kept >= r:  # fresh rows of smallest |A| go before the last replay rows
            return Fit(replay, 0, cut + r)
        return Fit(0, 0, cut + r - replay)
    return Fit(0, spare, cut, whole=True)


def plan_step(fresh: int, cfg: ReplayConfig, unit: "int | Unit" = 1, *, spare: int = 0, group_size: int = 1,
              n_filtered: Optional[int] = None) -> StepPlan:
    """The plan of a step with `fresh` fresh rows (with a fixed total: the fresh rows the engine took, `fixed_fresh`)
    and a full buffer after warm-up. `spare`: rows the engine may add (zero-variance rows not handed to the
    composition, its padding rows); `group_size`: rows per stored group (whole groups are drawn at group
    granularity); `n_filtered`: fill_filtered's replay count (default: every fresh row filtered, the largest).
    ConfigError naming `composition` for a fixed total and a composition without a rule for one."""
    u, n = as_unit(unit), int(fresh)
    g = int(group_size) if cfg.granularity == "group" else 1
    if u.total is not None:
        return _plan_fixed(n, cfg, u.total, g, n_filtered)
    kept_of, ask = _own_count(n, cfg, n_filtered)
    planned = ask - ask % g
    configured = _share(kept_of(ask), ask)
    reps = planned
    if u.multiple > 1 and ask > 0 and ((kept_of(planned) + planned) % u.multiple or planned == 0):
        reps = _nearest(kept_of, planned, u.multiple, g, _ratio(kept_of(ask), ask))
    fit = fit_rows(kept_of(reps), reps, u.multiple, spare)
    return StepPlan(fresh=n, ask=ask if reps == planned else reps, planned=planned,
                    kept=n if fit.whole else kept_of(reps) - fit.cut, replay=fit.replay,
                    pad=fit.pad, cut=fit.cut, unit=u.multiple, whole=fit.whole,
                    enabled=cfg.enabled, configured=float(configured))


def _own_count(n: int, cfg: ReplayConfig, n_filtered: Optional[int]) -> tuple[Callable[[int], int], int]:
    """(fresh rows kept beside R replay rows, replay rows the composition asks for)."""
    if not cfg.enabled:
        return (lambda r: n), 0
    if cfg.fill_filtered:
        return (lambda r: n), n if n_filtered is None else int(n_filtered)
    _, ask = PLANNED_ROWS.get(cfg.composition)(n, cfg.replay_ratio)
    kept = KEPT_ROWS.get(cfg.composition)
    return (lambda r: kept(n, r)), ask


def _nearest(kept_of: Callable[[int], int], planned: int, unit: int, g: int, target: Fraction) -> int:
    """The replay count (a multiple of g) whose rows with the composition's kept rows are a multiple of `unit`,
    nearest in replay rows per kept fresh row to `target` (the composition's own ratio); the fewer rows on a tie,
    so zero where the unit holds replay only at twice the ratio or more (one-row micro-batches at ratio 0.5: the
    plan vanishes and is refused). `planned` when none fits."""
    best, best_key = planned, None
    for r in range(0, planned + unit * g + 1, g):
        k = kept_of(r)
        if k < 0:
            break
        if k == 0 or (k + r) % unit:
            continue
        key = (abs(_ratio(k, r) - target), r)
        if best_key is None or key < best_key:
            best, best_key = r, key
    return best


def _ratio(kept: int, replay: int) -> Fraction:
    return Fraction(replay, kept) if kept else Fraction(0)


def _share(kept: int, replay: int) -> Fraction:
    return Fraction(replay, kept + replay) if kept + replay else Fraction(0)


def _fixed_rule(cfg: ReplayConfig, total: int):
    if cfg.composition not in FIXED_ROWS:
        raise ConfigError(
            f"ReplayConfig.composition={cfg.composition!r} has no rule for a step of a fixed size (TRL async packs "
            f"{total} samples a step); allowed: {', '.join(FIXED_ROWS.names())}")
    return FIXED_ROWS.get(cfg.composition)


def fixed_fresh(cfg: ReplayConfig, total: int, group_size: int = 1) -> int:
    """Fresh rows a fixed-size engine takes for a step of `total` rows (the composition's `FIXED_ROWS`; fewer where
    its count would leave no room for one replayed group). ConfigError naming `composition` where it has no rule."""
    rule = _fixed_rule(cfg, total)
    if not cfg.enabled or cfg.fill_filtered:
        return total
    n, ask = rule(total, cfg.replay_ratio)
    g = group_size if cfg.granularity == "group" else 1
    if 0 < ask < g and total > g and KEPT_ROWS.get(cfg.composition)(n, g) + g > total:
        n = total - g  # never zero: room for one replayed group
    return n


def _plan_fixed(n: int, cfg: ReplayConfig, total: int, g: int, n_filtered: Optional[int]) -> StepPlan:
    """A fixed total: `n` fresh rows taken (`fixed_fresh`), replay rows within the room the total leaves; the
    engine adds fresh rows for a short draw (fresh_anchored) and drops displaced (pool) or filtered (fill) ones."""
    _fixed_rule(cfg, total)
    if n > total:
        raise ValueError(f"plan_step: {n} fresh rows for a step of {total}")
    if not cfg.enabled:
        return StepPlan(fresh=n, ask=0, planned=0, kept=n, replay=0, extra=total - n, total=total, enabled=False)
    if cfg.fill_filtered:  # replay rows take the places of zero-variance rows
        ask, kept_of = (n if n_filtered is None else min(int(n_filtered), n)), (lambda r: n - r)
    else:
        kept = KEPT_ROWS.get(cfg.composition)
        kept_of = lambda r: kept(n, r)  # noqa: E731
        ask = PLANNED_ROWS.get(cfg.composition)(n, cfg.replay_ratio)[1]
        room = total - n if kept(n, 1) == n else n  # appended rows fit in what the total leaves
        ask = max(0, min(ask, room))
    planned = ask - ask % g
    reps = planned
    if planned == 0 and ask > 0 and 0 <= kept_of(g) and kept_of(g) + g <= total:
        reps = g  # never zero while the total holds a replayed group
    return StepPlan(fresh=n, ask=ask if reps == planned else reps, planned=planned, kept=kept_of(reps),
                    replay=reps, extra=total - kept_of(reps) - reps, total=total, enabled=True,
                    configured=float(_share(kept_of(ask), ask)))


def realised(plan: StepPlan, kept: int, replay: int, fit: Optional[Fit] = None) -> StepPlan:
    """`plan` with the counts a step really trained: `kept` fresh rows the composition kept and `replay` rows the
    draw gave, fitted by `fit` (None: a fixed total, whose shortfall the engine makes up with fresh rows)."""
    if plan.total is not None:
        return replace(plan, kept=kept, replay=replay, pad=0, cut=0, extra=plan.total - kept - replay)
    fit = fit or Fit(replay)
    return replace(plan, kept=plan.fresh if fit.whole else kept - fit.cut, replay=fit.replay, pad=fit.pad,
                   cut=0 if fit.whole else fit.cut, whole=fit.whole)
