"""The replay rows a step really trains on once an engine has cut the composed batch to its own unit.

An engine splits a step's update into equal micro-batches: TRL into `steps_per_generation` chunks of the rows of
one process (rows beyond a multiple are dropped), verl over its data-parallel ranks and mini-batches. The
integrations keep the composed batch a multiple of that unit by trimming trailing replay rows (fresh rows are
never trimmed). When the replay rows the composition asks for are not themselves a multiple of the unit, the
trimmed step replays fewer rows than the configured ratio says, at every step, silently; at the extreme (one
fresh row per micro-batch, ratio 0.5) it replays none and the arm is GRPO. `realised_share` says, before a run,
what a step with a full buffer after warm-up will train on, so that a trainer can refuse such a mapping.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .composition import PLANNED_ROWS
from .config import ReplayConfig


@dataclass(frozen=True)
class Share:
    """One step's rows per process with a full buffer after warm-up: planned by the composition, then realised
    after trimming to a multiple of `unit`."""

    fresh: int  # fresh rows generated (per process)
    kept: int  # fresh rows in the update (fewer than `fresh` under pool composition)
    planned: int  # replay rows the composition draws
    replay: int  # replay rows left after trimming
    unit: int  # the composed rows are cut to a multiple of this

    @property
    def rows(self) -> int:
        return self.kept + self.replay

    @property
    def share(self) -> float:
        """Replayed fraction of the update's rows after trimming."""
        return self.replay / self.rows if self.rows else 0.0

    @property
    def configured(self) -> float:
        """The fraction the composition asks for: replay_ratio / (1 + replay_ratio) at rollout granularity."""
        total = self.kept + self.planned
        return self.planned / total if total else 0.0

    @property
    def realised(self) -> bool:
        return self.replay == self.planned


def planned_rows(fresh: int, cfg: ReplayConfig) -> tuple[int, int]:
    """(fresh rows kept, replay rows drawn) of one step with `fresh` fresh rows and a full buffer after warm-up:
    the composition's own count (`composition.PLANNED_ROWS`; replay_ratio 0 asks for none)."""
    return PLANNED_ROWS.get(cfg.composition)(fresh, cfg.replay_ratio)


def realised_share(fresh: int, cfg: ReplayConfig, unit: int) -> Share:
    """The `Share` of a step whose composed rows are cut to a multiple of `unit` by dropping replay rows.
    With `fill_filtered` the replay rows replace the step's zero-variance rows, a number known only at run time;
    the plan is then the largest (every fresh group filtered), and trimming can drop up to unit - 1 rows."""
    if cfg.enabled and cfg.fill_filtered:
        kept, planned = fresh, fresh
    else:
        kept, planned = planned_rows(fresh, cfg)
    total = kept + planned
    replay = max(0, total - total % unit - kept)
    return Share(fresh=fresh, kept=kept, planned=planned, replay=min(replay, planned), unit=unit)


def units_that_realise(fresh: int, cfg: ReplayConfig, candidates: Iterable[int]) -> list[int]:
    """The units among `candidates` that leave the planned replay rows untrimmed."""
    return [u for u in candidates if realised_share(fresh, cfg, u).realised]
