"""`ReplaySession`: the replay method's bookkeeping around one training run, written once for every trainer.

A trainer (the built-in loop, an engine adapter) drives it in the order of Algorithm 1:

    session = ReplaySession(config, seed, engine_age_bound=None)   # the engine's own staleness bound, if any
    for step ...:
        composed = session.compose(fresh, step, n_filtered, unit=u)  # 4-6: evict, draw, compose, fit to the unit
        ... update on composed.batch; drift = per-row drift measured on the update's forward (max_drift)
        dropped = session.drifted(composed.batch, drift)        # replayed rows above max_drift leave the loss
        session.evict_drifted(composed.batch.buffer_seq[dropped])   # ... and the buffer
        session.defer(fresh_rows_with_behaviour_logps)           # 7: rows wait for the update window to close
        session.flush(before=next_step)                          # ... and enter the buffer with their birth steps
        tally = session.tally(composed.batch, step, ...)         # sums and counts; a backend all-reduces them
        log(step_row(tally, inserted=session.take_inserted(), buffer=session.buffer_metrics(step + 1)))  # step_metrics

What it owns: the `ReplayBuffer`; the effective age bound min(tau_max, the engine's staleness bound), fixed at
construction (an engine that drops samples older than its own bound can never be handed an older replay row);
the rows waiting for the update window (each keeps its own birth step, so rows of several steps enter in one
`ReplayBuffer.add`); the drift bound's eviction; the metrics in `metric_names`' vocabulary; save / load.
What an adapter keeps: converting its engine's batch to a `RolloutBatch` and back, its engine's unit (step_plan.py)
and the collective that agrees row counts across processes (`compose`'s `agree`), measuring the drift on its own
forward pass, and calling these methods from its engine's hooks.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np
import torch

from . import metric_names as mn
from .buffer import ReplayBuffer, check_fresh_rows
from .composed import ComposedBatch
from .composition import check_n_filtered, compose_batch
from .config import ReplayConfig
from .step_plan import StepPlan, Unit, as_unit, fit_rows, plan_step, realised
from .rollout import RolloutBatch, nonfinite_logp_rows, unchecked_batch
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
    stored group; by default each deferred batch numbers its own groups (a generation's, from 0)."""

    def __init__(self, config: ReplayConfig, seed: int = 0, *, engine_age_bound: Optional[int] = None,
                 storage=None, global_groups: bool = False, **buffer_overrides: Any):
        self.config = config
        self.global_groups = global_groups
        self.age_bound = effective_age_bound(config.tau_max, engine_age_bound)
        changes = {**({"tau_max": self.age_bound} if self.age_bound != config.tau_max else {}), **buffer_overrides}
        self.buffer = ReplayBuffer(config.replace(**changes) if changes else config, seed=seed, storage=storage)
        # (rows, prompt keys, the batch given to `defer` they are part of) in arrival order
        self.pending: list[tuple[RolloutBatch, Optional[np.ndarray], RolloutBatch]] = []
        self._flushed: list[tuple[RolloutBatch, int]] = []  # the last flush's: (batch given to `defer`, rows inserted)
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
    def defer(self, rows: RolloutBatch, prompt_keys: Optional[Sequence[int]] = None) -> RolloutBatch:
        """Queue fresh rows for the buffer until the update window they were trained in closes (`flush`), so no
        step replays rows born at that step. Returns `rows`: the adapter may still fill in their behaviour
        log-probs (in place) before the flush. Each row keeps its `birth_step`. Checked as `ReplayBuffer.add`
        checks a batch (`check_fresh_rows`: ValueError naming the field), so a batch the buffer would refuse never
        waits; only NaN or inf log-probs pass (the flush leaves those rows out)."""
        if len(rows):
            keys = check_fresh_rows(rows, "ReplaySession.defer", prompt_keys)
            self.pending.append((rows, None if prompt_keys is None else keys, rows))
        return rows

    def flush(self, before: Optional[int] = None) -> int:
        """Insert the waiting rows born before step `before` (all of them when None) in one `ReplayBuffer.add`,
        each with its own birth step, in birth order (rows of one birth in arrival order). Returns rows inserted. Rows with a
        NaN or inf log-prob at a counted token stay out (counted: `take_skipped_nonfinite`; per deferred batch,
        `inserted_from`).

        The group ids of each deferred batch are its own (an engine may number every generation's groups from 0):
        they are kept apart here, so rows of two batches never share a stored group.

        Atomic: each deferred batch is checked again (its log-probs may have been filled in since `defer`) before
        anything changes; a flush that raises leaves the waiting rows and the buffer as they were, and its ValueError
        names the deferred batch by its place among the waiting ones, in the order given to `defer`."""
        ready, waiting = self._split_pending(before)
        self._flushed = []
        if not ready:
            self.pending = waiting
            return 0
        self._check_ready([origin for _, _, origin in ready])
        batch, keys, source = _one_batch([(rows, keys) for rows, keys, _ in ready], self.global_groups)
        bad = nonfinite_logp_rows(batch).cpu()  # NaN/inf log-probs (a sampler's -inf under top-p): ratio undefined
        kept = torch.bincount(source[~bad], minlength=len(ready)).tolist()
        if bool(bad.any()):
            good = torch.nonzero(~bad).flatten()
            batch, keys = batch.select(good), None if keys is None else keys[good.numpy()]
        n = self.buffer.add(batch, prompt_keys=keys) if len(batch) else 0  # atomic: raises before any change
        self.pending = waiting
        self._flushed = [(origin, k) for (_, _, origin), k in zip(ready, kept)]
        self.skipped_nonfinite += int(bad.sum())
        self.inserted += n
        return n

    def _split_pending(self, before: Optional[int]) -> tuple[list, list]:
        """(the waiting rows born before `before` (all when None), the rest), as (rows, keys, origin) parts."""
        ready, waiting = [], []
        for rows, keys, origin in self.pending:
            born = rows.birth_step.cpu()
            take = torch.ones(len(rows), dtype=torch.bool) if before is None else born < int(before)
            if bool(take.all()):
                ready.append((rows, keys, origin))
            elif bool(take.any()):
                idx, rest = torch.nonzero(take).flatten(), torch.nonzero(~take).flatten()
                ready.append((rows.select(idx), None if keys is None else keys[idx.numpy()], origin))
                waiting.append((rows.select(rest), None if keys is None else keys[rest.numpy()], origin))
            else:
                waiting.append((rows, keys, origin))
        return ready, waiting

    def _check_ready(self, origins: list[RolloutBatch]) -> None:
        """`check_fresh_rows` of each deferred batch the flush takes rows of; the ValueError names the batch (its
        index among the batches waiting, in the order given to `defer`) and its rows as the caller numbered them."""
        waiting = list({id(origin): origin for _, _, origin in self.pending}.values())
        checked: set[int] = set()
        for origin in origins:
            if id(origin) in checked:
                continue
            checked.add(id(origin))
            index = next(i for i, o in enumerate(waiting) if o is origin)
            try:
                check_fresh_rows(origin, "ReplaySession.flush")
            except ValueError as e:
                raise ValueError(f"{e} (deferred batch {index} of the {len(waiting)} waiting, counted from 0 in the "
                                 "order given to defer; nothing was inserted and every waiting row is kept)") from None

    def inserted_from(self, rows: RolloutBatch) -> int:
        """Rows of `rows` (a batch given to `defer`) that the last `flush` inserted: those it took that had no NaN or
        inf log-prob at a counted token; 0 when it took none of them."""
        return sum(n for origin, n in self._flushed if origin is rows)

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
        """Replace the buffer with the one saved at `path` (validated: BufferStateError); nothing waits after it."""
        self.buffer = ReplayBuffer.load(path, config=self.buffer.config)
        self.pending = []

    def pending_state(self) -> list[dict[str, torch.Tensor]]:
        """The waiting rows as tensors only (what `torch.load(weights_only=True)` reads back), for an engine that
        checkpoints while rows wait (`load_pending` restores them)."""
        out = []
        for rows, keys, _ in self.pending:
            entry = {f.name: getattr(rows, f.name) for f in dataclasses.fields(RolloutBatch)
                     if getattr(rows, f.name) is not None}
            if keys is not None:
                entry["prompt_keys"] = torch.from_numpy(keys)
            out.append(entry)
        return out

    def load_pending(self, state: list[dict[str, torch.Tensor]]) -> None:
        """Restore `pending_state`; each entry is checked as a `RolloutBatch` (ValueError naming the field)."""
        pending = []
        for entry in state:
            entry = dict(entry)
            keys = entry.pop("prompt_keys", None)
            rows = RolloutBatch(**entry)
            pending.append((rows, None if keys is None else keys.numpy().astype(np.int64), rows))
        self.pending = pending

    def state_dict(self) -> dict[str, Any]:
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state)
        self.pending = []


def _one_batch(ready: list[tuple[RolloutBatch, Optional[np.ndarray]]],
               global_groups: bool) -> tuple[RolloutBatch, Optional[np.ndarray], torch.Tensor]:
    """The ready rows as one batch in birth order (stable: rows of one birth in arrival order), with their prompt
    keys (None when no batch had any) and each row's index in `ready`. Unless `global_groups`, each deferred batch's
    group ids are offset past the previous batches', so two batches' groups never merge."""
    source = torch.cat([torch.full((len(rows),), i, dtype=torch.long) for i, (rows, _) in enumerate(ready)])
    if len(ready) == 1:
        batch, keys = ready[0]
    else:
        parts, offset = [], 0
        for rows, _ in ready:
            if not global_groups:
                _, inv = torch.unique(rows.group_ids.cpu(), return_inverse=True)
                rows = _with_groups(rows, offset + inv)
                offset += int(inv.max()) + 1
            parts.append(rows)
        batch = RolloutBatch.concat(parts)
        keys = None
        if any(k is not None for _, k in ready):
            keys = np.concatenate([k if k is not None else np.full(len(r), -1, np.int64) for r, k in ready])
    born = batch.birth_step.cpu()
    if len(born) < 2 or bool((born[1:] >= born[:-1]).all()):
        return batch, keys, source
    order = torch.argsort(born, stable=True)
    return batch.select(order), None if keys is None else keys[order.numpy()], source[order]


def _largest_group(fresh: RolloutBatch) -> int:
    """Rows of the largest group of `fresh` (1 when it is empty)."""
    if not len(fresh):
        return 1
    return int(torch.unique(fresh.group_ids.cpu(), return_counts=True)[1].max())


def _with_groups(rows: RolloutBatch, group_ids: torch.Tensor) -> RolloutBatch:
    fields = {f.name: getattr(rows, f.name) for f in dataclasses.fields(RolloutBatch)}
    return unchecked_batch({**fields, "group_ids": group_ids.to(torch.long)})
