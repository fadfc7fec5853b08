"""`ReplaySession`: the replay method's bookkeeping around one training run, written once for every trainer.

A trainer (the built-in loop, an engine adapter) drives it in the order of Algorithm 1:

    session = ReplaySession(config, seed, engine_age_bound=None)   # the engine's own staleness bound, if any
    for step ...:
        composed = session.compose(fresh, step, n_filtered, unit=u)  # 4-6: evict, draw, compose, fit to the unit
        ... update on composed.batch; drift = per-row drift measured on the update's forward (max_drift)
        dropped = session.drifted(composed.batch, drift)        # replayed rows above max_drift leave the loss
        session.evict_drifted(composed.batch.buffer_seq[dropped])   # ... and the buffer
        handle = session.defer(fresh_rows)                      # 7: rows wait for the update window to close,
        handle.fill(rows, behaviour_logps)                       # (with missing_logps=True: written in the update)
        session.flush(before=next_step)                          # ... and enter the buffer with their birth steps
        tally = session.tally(composed.batch, step, ...)         # sums and counts; a backend all-reduces them
        log(step_row(tally, inserted=session.take_inserted(), buffer=session.buffer_metrics(step + 1)))  # step_metrics

What it owns: the `ReplayBuffer`; the effective age bound min(tau_max, the engine's staleness bound), fixed at
construction (an engine that drops samples older than its own bound can never be handed an older replay row);
the rows waiting for the update window (`Deferred` handles, deferred.py: each row has its insertion number from the
defer on and keeps its own birth step, so rows of several steps enter in one `ReplayBuffer.add`); the drift bound's
eviction; the metrics in `metric_names`' vocabulary; save / load.
What an adapter keeps: converting its engine's batch to a `RolloutBatch` and back, its engine's unit (step_plan.py)
and the collective that agrees row counts across processes (`compose`'s `agree`), measuring the drift on its own
forward pass, and calling these methods from its engine's hooks.
"""
from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np
import torch

from . import metric_names as mn
from .buffer import ReplayBuffer, check_fresh_rows
from .composed import ComposedBatch
from .composition import check_n_filtered, compose_batch
from .config import ReplayConfig
from . import deferred as dfr
from .deferred import Deferred
from .step_plan import StepPlan, Unit, as_unit, fit_rows, plan_step, realised
from .rollout import RolloutBatch, nonfinite_logp_rows
from .tally import Tally

__all__ = ["ReplaySession", "Fitted", "effective_age_bound", "over_drift_bound"]


class Fitted(NamedTuple):
    """What `ReplaySession.compose` returns: the composed batch fitted to the engine's unit."""

    batch: RolloutBatch
    """The update's rows: the kept fresh rows first, in their original order, then the replay rows (the engine adds
    `plan.pad` of its spare rows, and with a fixed total `plan.extra` fresh rows, itself)."""
    fresh_index: torch.Tensor
    """(n_kept,) long: indices into `fresh` of the kept rows, in the batch's order."""
    plan: StepPlan
    """The step's realised counts (`plan.share` is the replay/share every trainer logs)."""


def effective_age_bound(tau_max: Optional[int], engine_bound: Optional[int]) -> Optional[int]:
    """The oldest age a replayed row may have: min(tau_max, the engine's staleness bound); None = neither bounds it."""
    if engine_bound is None:
        return tau_max
    return int(engine_bound) if tau_max is None else min(int(tau_max), int(engine_bound))


def over_drift_bound(is_replay: torch.Tensor, drift: torch.Tensor, max_drift: float) -> torch.Tensor:
    """(B,) bool: the replayed rows whose drift exceeds `max_drift` (fresh rows never are), on the CPU."""
    return is_replay.cpu() & (drift.detach().cpu() > max_drift)


class ReplaySession:
    """The buffer and the rows on their way into it, for one run (one process).

    `config`: the replay settings as the user gave them. `engine_age_bound`: the engine's own staleness bound in
    its age unit (TRL async's max_staleness, verl's off-policy bound), None when it has none; the buffer evicts by
    `age_bound` = min(tau_max, it). `buffer_overrides` are `ReplayConfig` fields the buffer itself is built with
    instead (an engine that counts warm-up in other units than ages, say), `storage` its row layout. `global_groups`: the engine's
    group ids are unique over the run (TRL async's), so rows of one group deferred in several batches stay one
    stored group; by default each deferred batch numbers its own groups (a generation's, from 0).
    `report_evictions`: the buffer keeps the insertion numbers it evicts for `take_evicted`."""

    def __init__(self, config: ReplayConfig, seed: int = 0, *, engine_age_bound: Optional[int] = None,
                 storage=None, global_groups: bool = False, report_evictions: bool = False, **buffer_overrides: Any):
        self.config = config
        self.global_groups = global_groups
        self.age_bound = effective_age_bound(config.tau_max, engine_age_bound)
        changes = {**({"tau_max": self.age_bound} if self.age_bound != config.tau_max else {}), **buffer_overrides}
        self.buffer = ReplayBuffer(config.replace(**changes) if changes else config, seed=seed, storage=storage,
                                   report_evictions=report_evictions)
        # the waiting rows, in defer order: (the handle, its rows still waiting, None: all)
        self.pending: list[dfr.Part] = []
        self.flushed: list[Deferred] = []  # the handles the last flush took rows of
        self.inserted = 0  # rows inserted since `take_inserted` last read it
        self.skipped_nonfinite = 0  # rows left out of an insert since `take_skipped_nonfinite` last read it

    # --- Algorithm 1 steps 4-6 ------------------------------------------------------------------------
    def compose(self, fresh: RolloutBatch, step: int, n_filtered: Optional[int] = None, *, unit: "int | Unit" = 1,
                spare: int = 0, agree: Optional[Callable[[int], int]] = None,
                group_size: Optional[int] = None,
                screen: Optional[Callable[[RolloutBatch], Optional[torch.Tensor]]] = None) -> "Fitted":
        """Evict rows older than the age bound, draw replay rows by priority, compose them with `fresh`
        (`compose_batch`; `n_filtered`: the fresh rows the zero-variance filter removed, for fill_filtered), and fit
        the composed rows to the engine's `unit` (step_plan.py: a row multiple, or a fixed total).

        The buffer is asked for the step plan's replay count; what the draw gave is fitted by the plan's one rule
        (`fit_rows`): the last replay rows dropped, `spare` engine rows added (the first `plan.pad` of them: the
        engine's), the kept fresh rows of smallest |A| left out. `agree(rows) -> rows`: the smallest composed row
        count over processes, for an engine whose processes must train equal counts. `group_size`: rows per stored
        group (whole groups at group granularity; default: the largest group of `fresh`). `screen(replay) -> (R,)
        bool`: the drawn replay rows an engine keeps before the fit (None: all; TRL's drift bound leaves some out),
        called on every draw, an empty one included. With a full buffer the result is `plan_step`'s; the built-in
        trainer (unit 1) is never cut."""
        cfg, u = self.config, as_unit(unit)
        if cfg.fill_filtered:
            check_n_filtered(n_filtered)
        g = group_size if group_size is not None else _largest_group(fresh)
        plan = plan_step(len(fresh), cfg, u, spare=spare, group_size=g, n_filtered=n_filtered)
        composed, kept = compose_batch(fresh, self.buffer, step, n_filtered=n_filtered, n_replay=plan.ask)
        rep = torch.nonzero(composed.is_replay).flatten()
        keep = None if screen is None else screen(composed.select(rep))
        if keep is not None and not bool(keep.all()):
            rep = rep[keep.cpu()]
            composed = ComposedBatch([fresh.select(kept), composed.select(rep)])
            rep = torch.arange(len(kept), len(kept) + len(rep))
        if u.total is not None:  # fill_filtered: the engine drops as many zero-variance rows as were drawn
            n_kept = len(kept) - (len(rep) if cfg.fill_filtered else 0)
            return Fitted(composed, kept, realised(plan, n_kept, len(rep)))
        fit = fit_rows(len(kept), len(rep), u.multiple, spare, agree)
        done = realised(plan, len(kept), len(rep), fit)
        if fit.whole:
            return Fitted(ComposedBatch([fresh]), torch.arange(len(fresh)), done)
        if fit.replay == len(rep) and fit.cut == 0:
            return Fitted(composed, kept, done)
        if fit.cut:  # the kept fresh rows of smallest |A| leave (stable: the first of equal |A| first)
            order = torch.from_numpy(np.argsort(fresh.advantages[kept].abs().cpu().numpy(), kind="stable"))
            kept = kept[torch.sort(order[fit.cut:]).values]
        return Fitted(ComposedBatch([fresh.select(kept), composed.select(rep[: fit.replay])]), kept, done)

    # --- Algorithm 1 step 7 ---------------------------------------------------------------------------
    def defer(self, rows: RolloutBatch, prompt_keys: Optional[Sequence[int]] = None, *,
              missing_logps: Any = False) -> Deferred:
        """Queue fresh rows for the buffer until the update window they were trained in closes (`flush`), so no
        step replays rows born at that step. Returns their `Deferred` handle: the insertion numbers the rows get
        (`handle.seqs`, reserved now: `ReplayBuffer.reserve`), `fill` for behaviour log-probs measured later
        (`missing_logps`: True, or (n,) bool, for the rows whose log-probs are still to come; a flush refuses them
        until filled), and after the flush what was inserted. Each row keeps its `birth_step`. Checked as
        `ReplayBuffer.add` checks a batch (`check_fresh_rows`: ValueError naming the field), so a batch the buffer
        would refuse never waits; only NaN or inf log-probs pass (the flush leaves those rows out, their numbers
        unused)."""
        missing = dfr.as_missing(missing_logps, len(rows))
        if not len(rows):
            return Deferred(rows, np.zeros(0, np.int64), None, missing)
        keys = check_fresh_rows(rows, "ReplaySession.defer", prompt_keys)
        handle = Deferred(rows, self.buffer.reserve(len(rows)), None if prompt_keys is None else keys, missing)
        self.pending.append((handle, None))
        return handle

    def flush(self, before: Optional[int] = None) -> int:
        """Insert the waiting rows born before step `before` (all of them when None) in one `ReplayBuffer.add`,
        each with its own birth step and its reserved insertion number, in birth order (rows of one birth in defer
        order). Returns rows inserted. Rows with a NaN or inf log-prob at a counted token stay out (counted:
        `take_skipped_nonfinite`; per handle, `Deferred.skipped`). The handles it took rows of are `flushed`,
        their `inserted` numbers updated.

        The group ids of each deferred batch are its own (an engine may number every generation's groups from 0):
        they are kept apart here, so rows of two batches never share a stored group.

        Atomic: each deferred batch is checked again (its log-probs may have been filled in since `defer`; none of
        its ready rows may still miss them) before anything changes; a flush that raises leaves the waiting rows
        and the buffer as they were, and its ValueError names the deferred batch by its place among the waiting
        ones, in the order given to `defer`."""
        ready, waiting = dfr.split(self.pending, before)
        self.flushed = []
        if not ready:
            self.pending = waiting
            return 0
        self._check_ready(ready)
        batch, keys, seqs, source = dfr.one_batch(ready, self.global_groups)
        bad = nonfinite_logp_rows(batch).cpu()  # NaN/inf log-probs (a sampler's -inf under top-p): ratio undefined
        good = ~bad.numpy()
        if not good.all():
            idx = torch.from_numpy(np.flatnonzero(good))
            batch, keys = batch.select(idx), None if keys is None else keys[good]
        n = self.buffer.add(batch, prompt_keys=keys, seqs=seqs[good]) if good.any() else 0  # atomic: raises first
        self.pending = waiting
        src = source.numpy()
        for i, (d, idx) in enumerate(ready):
            mine = src == i
            d.inserted = np.concatenate([d.inserted, seqs[mine & good]])
            d.skipped = np.concatenate([d.skipped, seqs[mine & ~good]])
            d.waiting -= int(mine.sum())
        self.flushed = dfr.unique_handles(ready)
        self.skipped_nonfinite += int(bad.sum())
        self.inserted += n
        return n

    def _check_ready(self, ready: list[dfr.Part]) -> None:
        """The deferred batches the flush takes rows of: none of those rows misses its behaviour log-probs, and
        each batch passes `check_fresh_rows`; the ValueError names the batch (its index among the batches
        waiting, in the order given to `defer`) and its rows as the caller numbered them."""
        waiting = dfr.unique_handles(self.pending)
        dfr.check_missing(ready, waiting)
        for d in dfr.unique_handles(ready):
            try:
                check_fresh_rows(d.rows, "ReplaySession.flush")
            except ValueError as e:
                raise ValueError(f"{e} (deferred batch {dfr.place(d, waiting)}; nothing was inserted and every "
                                 "waiting row is kept)") from None

    def waiting(self) -> list[Deferred]:
        """The handles with rows still waiting, in defer order."""
        return dfr.unique_handles(self.pending)

    def take_skipped_nonfinite(self) -> int:
        """Rows left out of the inserts since the last call for a NaN or inf behaviour or reference log-prob at a
        counted token (`rollout.nonfinite_logp_rows`: the buffer refuses them; metric `buffer/skipped_nonfinite_logps`)."""
        n, self.skipped_nonfinite = self.skipped_nonfinite, 0
        return n

    def take_inserted(self) -> int:
        """Rows inserted since the last call (for a metrics row logged once per window)."""
        n, self.inserted = self.inserted, 0
        return n

    # --- drift-bounded staleness (ReplayConfig.max_drift) ------------------------------------------------
    def drifted(self, batch: RolloutBatch, drift: torch.Tensor) -> torch.Tensor:
        """(B,) bool: the replayed rows of `batch` whose drift (`loss.replay_drift`, per row) exceeds max_drift;
        none without the option. Fresh rows are never among them."""
        if self.config.max_drift is None:
            return torch.zeros(len(batch), dtype=torch.bool)
        return over_drift_bound(batch.is_replay, drift, self.config.max_drift)

    def evict_drifted(self, seqs: Any) -> int:
        """Evict the stored rows with insertion numbers `seqs` (the `buffer_seq` of the replayed rows an update
        left out for drift) from the buffer. Returns rows evicted."""
        return self.buffer.evict_rows(seqs) if len(seqs) else 0

    # --- metrics --------------------------------------------------------------------------------------
    def tally(self, batch: RolloutBatch, step: int, *, groups: Optional[int] = None,
              zero_variance_groups: Optional[int] = None, drift: Optional[torch.Tensor] = None,
              dropped: Optional[torch.Tensor] = None) -> Tally:
        """This process's sums and counts of one update batch (`Tally`): rows, |A| and ages by kind; with
        `groups`, the zero-variance share of the step's generated groups; under max_drift, the replayed rows'
        drift and the rows dropped. A backend all-reduces tallies (`Tally.merge`) before `step_metrics.step_row`."""
        return Tally.of(batch, step, groups=groups, zero_variance_groups=zero_variance_groups,
                        drift=drift if self.config.max_drift is not None else None,
                        dropped=dropped if self.config.max_drift is not None else None)

    def buffer_metrics(self, step: int) -> dict[str, Any]:
        """The buffer's size, ages (at `step`), bytes and eviction totals (`ReplayBuffer.stats`)."""
        return self.buffer.stats(step)

    def totals(self) -> dict[str, float]:
        """This process's buffer counters under their metric names (sums over processes are the run's)."""
        out = {mn.BUFFER_SIZE: float(len(self.buffer)), mn.BUFFER_EVICTED_AGE: float(self.buffer.total_evicted_age)}
        if self.config.max_uses is not None:
            out[mn.BUFFER_EVICTED_USES] = float(self.buffer.total_evicted_uses)
        if self.config.max_drift is not None:
            out[mn.BUFFER_EVICTED_DRIFT] = float(self.buffer.total_evicted_drift)
        return out

    # --- persistence ----------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """The buffer (`ReplayBuffer.save`). Rows still waiting are the adapter's to save: flush them first, or
        keep them with the engine's own state (they are engine samples until they enter the buffer)."""
        self.buffer.save(path)

    def load(self, path: str | os.PathLike) -> None:
        """Replace the buffer with the one saved at `path` (validated: BufferStateError); nothing waits after it,
        and no eviction waits to be reported (`ReplayBuffer.take_evicted`)."""
        self.buffer = ReplayBuffer.load(path, config=self.buffer.config, report_evictions=self.buffer.report_evictions)
        self.pending = []

    def pending_state(self) -> list[dict[str, torch.Tensor]]:
        """The waiting rows as tensors only (what `torch.load(weights_only=True)` reads back), with their insertion
        numbers, for an engine that checkpoints while rows wait (`load_pending` restores them; save the buffer
        with them: it knows those numbers as handed out)."""
        return dfr.state_of(self.pending)

    def load_pending(self, state: list[dict[str, torch.Tensor]]) -> list[Deferred]:
        """Restore `pending_state` (after `load`), one handle per entry (returned); each entry is checked as a
        `RolloutBatch` (ValueError naming the field). Entries saved without insertion numbers get new ones."""
        pending = []
        for entry in state:
            rows, keys, seqs, missing = dfr.entry_parts(entry)
            if seqs is None:
                seqs = self.buffer.reserve(len(rows))
            elif len(seqs) and int(seqs.max()) >= self.buffer.next_seq:  # saved without the buffer's counter
                self.buffer.reserve(int(seqs.max()) + 1 - self.buffer.next_seq)
            pending.append((Deferred(rows, seqs, keys, missing), None))
        self.pending = pending
        return [d for d, _ in pending]

    def state_dict(self) -> dict[str, Any]:
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state)
        self.pending = []


def _largest_group(fresh: RolloutBatch) -> int:
    """Rows of the largest group of `fresh` (1 when it is empty)."""
    if not len(fresh):
        return 1
    return int(torch.unique(fresh.group_ids.cpu(), return_counts=True)[1].max())
