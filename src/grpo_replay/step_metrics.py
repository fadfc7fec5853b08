"""One step's replay metrics row and one replay history record, the same for every trainer.

`step_row` assembles what a trainer logs of a step's replay: the update batch's counts, share, |A|, ages, the
zero-variance share and drift (a merged `Tally`), the rows inserted, the buffer's statistics and the rows left out
of the insert. A trainer that logs a step in parts (TRL sync logs the insert when its window closes) calls it once per
part. `ReplayRecord` is the `replay_history` entry of the TRL trainers and of `--backend trl`'s trl_summary.json.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from . import metric_names as mn
from .tally import Tally

# Tally's ages are in steps; an engine that counts policy versions logs them under the versions names.
_AGES_IN_VERSIONS = {mn.REPLAY_AGE_MEAN: mn.REPLAY_AGE_VERSIONS_MEAN, mn.REPLAY_AGE_MAX: mn.REPLAY_AGE_VERSIONS_MAX}


def step_row(tally: Optional[Tally] = None, *, inserted: Optional[float] = None,
             buffer: Optional[Mapping[str, Any]] = None, skipped_nonfinite: float = 0,
             ages_in_versions: bool = False, lists: bool = True) -> dict[str, Any]:
    """The replay entries of a step's metrics row under `metric_names`' names.

    tally: the update batch's (merged over processes), None: no update-batch entries; inserted: rows that entered
    the buffer (None: not logged); buffer: the buffer's entries (`ReplaySession.buffer_metrics` or `totals`, already
    under their names); skipped_nonfinite: rows left out of the insert (`buffer/skipped_nonfinite_logps`, logged
    when > 0); ages_in_versions: the replayed rows' ages are policy versions (`replay/age_versions_*`, no
    histogram); lists: keep the histograms (a tracker of scalars: False)."""
    out: dict[str, Any] = {}
    if tally is not None:
        for k, v in tally.metrics().items():
            if ages_in_versions and k == mn.REPLAY_AGE_HIST:
                continue
            out[_AGES_IN_VERSIONS.get(k, k) if ages_in_versions else k] = v
    if inserted is not None:
        out[mn.REPLAY_INSERTED] = inserted
    out.update(buffer or {})
    if skipped_nonfinite:
        out[mn.BUFFER_SKIPPED_NONFINITE] = skipped_nonfinite
    return out if lists else {k: v for k, v in out.items() if not isinstance(v, list)}


# Entries kept only in memory (the trainer's deque), not written to trl_summary.json: token ids and whole samples.
HEAVY = ("replay_completion_ids", "samples")


class ReplayRecord(dict):
    """One optimizer step's replay, as the TRL trainers keep it in `replay_history` (str -> value, every key always
    present; None where the trainer does not know it yet or at all):

    step: the optimizer step; version: the policy version trained (TRL async; None where ages count steps);
    fresh_rows, replay_rows: rows of the update by kind (the replayed rows drawn, before max_drift's drop);
    inserted: rows of the step that entered the buffer (TRL sync: the rows queued until its window flushes them);
    buffer_size: rows the buffer holds (TRL sync: after the flush, None before); replay_birth_steps, replay_ages:
    per replayed row, its birth and age in the trainer's age unit (steps, or TRL async's policy versions);
    replay_advantages, fresh_advantages: per row (None where not kept); `HEAVY` entries when the trainer keeps them.
    """

    @classmethod
    def of(cls, *, step: int, fresh_rows: int, replay_rows: int, replay_birth_steps: Sequence[int],
           replay_ages: Sequence[int], inserted: Optional[int] = None, buffer_size: Optional[int] = None,
           version: Optional[int] = None, replay_advantages: Optional[Sequence[float]] = None,
           fresh_advantages: Optional[Sequence[float]] = None, **heavy: Any) -> "ReplayRecord":
        unknown = set(heavy) - set(HEAVY)
        if unknown:
            raise TypeError(f"ReplayRecord.of: unknown entries {sorted(unknown)}; allowed extra entries: {list(HEAVY)}")
        return cls(step=int(step), version=None if version is None else int(version), fresh_rows=int(fresh_rows),
                   replay_rows=int(replay_rows), inserted=inserted, buffer_size=buffer_size,
                   replay_birth_steps=list(replay_birth_steps), replay_ages=list(replay_ages),
                   replay_advantages=None if replay_advantages is None else list(replay_advantages),
                   fresh_advantages=None if fresh_advantages is None else list(fresh_advantages), **heavy)

    def public(self) -> dict[str, Any]:
        """The record without its `HEAVY` entries (what trl_summary.json keeps)."""
        return {k: v for k, v in self.items() if k not in HEAVY}
