"""`Deferred`: rows given to `ReplaySession.defer`, on their way into the buffer; and the waiting list's bookkeeping.

A deferred batch gets its insertion numbers when it is deferred (`ReplayBuffer.reserve`, the numbering of
`buffer_seq` and `ReplayBuffer.next_seq`): an engine that keeps a row's tokens elsewhere (verl v1's row store) names
it by that number at once. The rows enter the buffer at a flush, in birth order, each with its reserved number; a
row left out there (a NaN or inf log-prob at a counted token) leaves its number unused, so the numbers stored are
unique and never reused, not necessarily consecutive. An adapter whose update measures the behaviour log-probs after
the defer (TRL sync) defers with `missing_logps=True` and writes them with `Deferred.fill`; a flush refuses a batch
whose ready rows still miss some.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np
import torch

from .rollout import RolloutBatch, unchecked_batch

__all__ = ["Deferred"]


class Deferred:
    """One batch given to `ReplaySession.defer`.

    `rows`: (n, ...) the batch as given (its `behaviour_logps` are written in place by `fill`); `seqs`: (n,) int64
    the insertion numbers its rows get; `prompt_keys`: (n,) int64 or None; `missing`: (n,) bool, the rows whose
    behaviour log-probs are still to be written; `inserted` / `skipped`: the numbers of the rows the flushes so far
    inserted / left out for a NaN or inf log-prob; `waiting`: rows not flushed yet. `note` is the adapter's own (a
    history record, say): the session never reads it."""

    def __init__(self, rows: RolloutBatch, seqs: np.ndarray, prompt_keys: Optional[np.ndarray],
                 missing: torch.Tensor):
        self.rows = rows
        self.seqs = seqs
        self.prompt_keys = prompt_keys
        self.missing = missing
        self.inserted = np.zeros(0, np.int64)
        self.skipped = np.zeros(0, np.int64)
        self.waiting = len(rows)
        self.note: Any = None

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return (f"Deferred({len(self)} rows, numbers {self.seqs[:1].tolist()}..., waiting={self.waiting}, "
                f"missing={int(self.missing.sum())}, inserted={len(self.inserted)}, skipped={len(self.skipped)})")

    @property
    def n_inserted(self) -> int:
        return len(self.inserted)

    def missing_rows(self) -> np.ndarray:
        """(k,) int64: rows (of `rows`) whose behaviour log-probs are still to be written."""
        return torch.nonzero(self.missing).flatten().numpy().astype(np.int64)

    def fill(self, index: Any, logps: torch.Tensor) -> None:
        """Write the behaviour log-probs of rows `index` ((k,) long or bool over `rows`): `logps` (k, >= C), its
        first C columns (C: the rows' completion width; an engine's forward may be wider), detached, float32, on
        the CPU. Refused (ValueError) once a flush has taken rows of the batch."""
        index = torch.as_tensor(index).cpu()
        if index.dtype == torch.bool:
            index = torch.nonzero(index).flatten()
        if not len(index):
            return
        if self.waiting < len(self):
            raise ValueError(f"Deferred.fill: {self!r} has been flushed; fill behaviour_logps before the flush")
        stored = self.rows.behaviour_logps
        width = stored.shape[1]
        if logps.dim() != 2 or logps.shape[0] != len(index) or logps.shape[1] < width:
            raise ValueError(f"Deferred.fill: logps has shape {tuple(logps.shape)}; allowed: ({len(index)}, >= {width})"
                             " (one row per index, at least the rows' completion width)")
        stored[index] = logps[:, :width].detach().to(device="cpu", dtype=stored.dtype)
        self.missing[index] = False


Part = tuple[Deferred, Optional[torch.Tensor]]
"""A deferred batch and its rows a list holds ((k,) long; None: all of them)."""


def part_rows(part: Part) -> tuple[RolloutBatch, Optional[np.ndarray], np.ndarray]:
    """(the part's rows, their prompt keys or None, their insertion numbers)."""
    d, idx = part
    if idx is None:
        return d.rows, d.prompt_keys, d.seqs
    i = idx.numpy()
    return d.rows.select(idx), None if d.prompt_keys is None else d.prompt_keys[i], d.seqs[i]


def split(pending: list[Part], before: Optional[int]) -> tuple[list[Part], list[Part]]:
    """(the waiting rows born before `before` (all when None), the rest), as parts in defer order."""
    ready, waiting = [], []
    for d, idx in pending:
        if before is None:
            ready.append((d, idx))
            continue
        born = d.rows.birth_step.cpu() if idx is None else d.rows.birth_step.cpu()[idx]
        take = born < int(before)
        if bool(take.all()):
            ready.append((d, idx))
        elif bool(take.any()):
            rows = torch.arange(len(d)) if idx is None else idx
            ready.append((d, rows[take]))
            waiting.append((d, rows[~take]))
        else:
            waiting.append((d, idx))
    return ready, waiting


def check_missing(ready: list[Part], waiting: list[Deferred]) -> None:
    """ValueError naming the first deferred batch whose ready rows still miss behaviour log-probs."""
    for d, idx in ready:
        missing = d.missing if idx is None else d.missing[idx]
        if bool(missing.any()):
            rows = d.missing_rows()
            raise ValueError(
                f"ReplaySession.flush: behaviour_logps of rows {rows[:5].tolist()} ({len(rows)}) of deferred batch "
                f"{place(d, waiting)} were never written (Deferred.fill); nothing was inserted and every waiting "
                "row is kept")


def place(d: Deferred, waiting: list[Deferred]) -> str:
    """How an error names `d`: its place among the waiting batches."""
    index = next(i for i, o in enumerate(waiting) if o is d)
    return f"{index} of the {len(waiting)} waiting, counted from 0 in the order given to defer"


def one_batch(ready: list[Part], global_groups: bool
              ) -> tuple[RolloutBatch, Optional[np.ndarray], np.ndarray, torch.Tensor]:
    """The ready rows as one batch in birth order (stable: rows of one birth in defer order), with their prompt
    keys (None when no batch had any), their insertion numbers and each row's index in `ready`. Unless
    `global_groups`, each deferred batch's group ids are offset past the previous batches', so two batches' groups
    never merge."""
    parts = [part_rows(p) for p in ready]
    source = torch.cat([torch.full((len(rows),), i, dtype=torch.long) for i, (rows, _, _) in enumerate(parts)])
    seqs = np.concatenate([s for _, _, s in parts])
    if len(parts) == 1:
        batch, keys = parts[0][0], parts[0][1]
    else:
        batches, offset = [], 0
        for rows, _, _ in parts:
            if not global_groups:
                _, inv = torch.unique(rows.group_ids.cpu(), return_inverse=True)
                rows = _with_groups(rows, offset + inv)
                offset += int(inv.max()) + 1
            batches.append(rows)
        batch = RolloutBatch.concat(batches)
        keys = None
        if any(k is not None for _, k, _ in parts):
            keys = np.concatenate([k if k is not None else np.full(len(r), -1, np.int64) for r, k, _ in parts])
    born = batch.birth_step.cpu()
    if len(born) < 2 or bool((born[1:] >= born[:-1]).all()):
        return batch, keys, seqs, source
    order = torch.argsort(born, stable=True)
    o = order.numpy()
    return batch.select(order), None if keys is None else keys[o], seqs[o], source[order]


def _with_groups(rows: RolloutBatch, group_ids: torch.Tensor) -> RolloutBatch:
    fields = {f.name: getattr(rows, f.name) for f in dataclasses.fields(RolloutBatch)}
    return unchecked_batch({**fields, "group_ids": group_ids.to(torch.long)})


def state_of(pending: list[Part]) -> list[dict[str, torch.Tensor]]:
    """The waiting rows as tensors only, one entry per part: the `RolloutBatch` fields, `prompt_keys` when given,
    `insertion_numbers`, and `missing_logps` when some are missing."""
    out = []
    for part in pending:
        rows, keys, seqs = part_rows(part)
        d, idx = part
        entry = {f.name: getattr(rows, f.name) for f in dataclasses.fields(RolloutBatch)
                 if getattr(rows, f.name) is not None}
        if keys is not None:
            entry["prompt_keys"] = torch.from_numpy(keys.copy())
        entry["insertion_numbers"] = torch.from_numpy(seqs.copy())
        missing = d.missing if idx is None else d.missing[idx]
        if bool(missing.any()):
            entry["missing_logps"] = missing.clone()
        out.append(entry)
    return out


def entry_parts(entry: dict[str, torch.Tensor]) -> tuple[RolloutBatch, Optional[np.ndarray], Optional[np.ndarray],
                                                           torch.Tensor]:
    """(rows, prompt keys, insertion numbers (None: saved before they were kept), missing) of a `state_of` entry;
    the rows are checked as a `RolloutBatch` (ValueError naming the field)."""
    entry = dict(entry)
    keys = entry.pop("prompt_keys", None)
    seqs = entry.pop("insertion_numbers", None)
    missing = entry.pop("missing_logps", None)
    rows = RolloutBatch(**entry)
    n = len(rows)
    if seqs is not None and tuple(seqs.shape) != (n,):
        raise ValueError(f"ReplaySession.load_pending: insertion_numbers has shape {tuple(seqs.shape)}; "
                         f"allowed: ({n},)")
    missing = torch.zeros(n, dtype=torch.bool) if missing is None else missing.to(torch.bool).clone()
    return (rows, None if keys is None else keys.numpy().astype(np.int64),
            None if seqs is None else seqs.numpy().astype(np.int64), missing)


def as_missing(missing_logps: Any, n: int) -> torch.Tensor:
    """(n,) bool from `defer`'s `missing_logps` (a bool for every row, or (n,) bool)."""
    if isinstance(missing_logps, (bool, np.bool_)):
        return torch.full((n,), bool(missing_logps), dtype=torch.bool)
    m = torch.as_tensor(missing_logps).cpu()
    if m.dtype != torch.bool or tuple(m.shape) != (n,):
        raise ValueError(f"ReplaySession.defer: missing_logps has shape {tuple(m.shape)} and dtype {m.dtype}; "
                         f"allowed: a bool, or {n} bools (one per row)")
    return m.clone()


def unique_handles(parts: Sequence[Part]) -> list[Deferred]:
    """The deferred batches of `parts`, once each, in order."""
    return list({id(d): d for d, _ in parts}.values())
