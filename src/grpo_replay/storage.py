"""Slot storage for rollouts: compact, unpadded, CPU, numpy.

Scalar fields live in columns indexed by slot; token data lives in one small tuple of arrays per slot
(int32 prompt ids, int32 completion ids, float32 behaviour log-probs, bool completion mask, optional
float32 reference log-probs). Freed slots are reused LIFO. The exact slot layout is part of `state_dict`, so a
restored storage enumerates candidates in the same order and a seeded sampler draws the same rows.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

# name -> dtype of the scalar columns kept per slot
COLUMNS: dict[str, Any] = {
    "birth_step": np.int64,
    "advantage": np.float32,
    "reward": np.float32,
    "group_std": np.float32,
    "group_key": np.int64,  # buffer-wide unique group id
    "prompt_key": np.int64,  # caller's stable prompt identity (-1 if none)
    "weight": np.float64,  # sampling weight, frozen at insertion like the advantage it derives from
    "seq": np.int64,  # insertion counter: the capacity backstop evicts the smallest first
}


class RolloutStorage:
    def __init__(self, initial_slots: int = 1024):
        self._cols = {k: np.zeros(initial_slots, dtype=dt) for k, dt in COLUMNS.items()}
        self.valid = np.zeros(initial_slots, dtype=bool)
        self._tokens: list[Optional[tuple]] = [None] * initial_slots
        self._free: list[int] = list(range(initial_slots - 1, -1, -1))  # pop() yields slot 0 first
        self._count = 0
        self._seq = 0

    def __len__(self) -> int:
        return self._count

    def col(self, name: str) -> np.ndarray:
        return self._cols[name]

    def valid_slots(self) -> np.ndarray:
        return np.flatnonzero(self.valid)

    def _grow(self) -> None:
        old = len(self.valid)
        new = old * 2
        for k in self._cols:
            self._cols[k] = np.concatenate([self._cols[k], np.zeros(new - old, dtype=self._cols[k].dtype)])
        self.valid = np.concatenate([self.valid, np.zeros(new - old, dtype=bool)])
        self._tokens.extend([None] * (new - old))
        self._free.extend(range(new - 1, old - 1, -1))

    def add(self, scalars: dict[str, np.ndarray], tokens: list[tuple]) -> np.ndarray:
        """Store len(tokens) rows; `scalars` maps every column except seq to an array of that length."""
        n = len(tokens)
        while len(self._free) < n:
            self._grow()
        slots = np.array([self._free.pop() for _ in range(n)], dtype=np.int64)
        for k, arr in scalars.items():
            self._cols[k][slots] = arr
        self._cols["seq"][slots] = np.arange(self._seq, self._seq + n)
        self._seq += n
        self.valid[slots] = True
        for s, tok in zip(slots.tolist(), tokens):
            self._tokens[s] = tok
        self._count += n
        return slots

    def remove(self, slots: np.ndarray) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size == 0:
            return
        if not self.valid[slots].all():
            raise KeyError("RolloutStorage.remove: slot not occupied")
        self.valid[slots] = False
        for s in slots.tolist():
            self._tokens[s] = None
        # Reverse so that the lowest freed slot is reused first, keeping the layout compact and deterministic.
        self._free.extend(sorted(slots.tolist(), reverse=True))
        self._count -= len(slots)

    def tokens(self, slot: int) -> tuple:
        return self._tokens[slot]

    def nbytes(self) -> int:
        """Bytes held: columns for all allocated slots plus the token arrays of stored rollouts."""
        cols = sum(c.nbytes for c in self._cols.values()) + self.valid.nbytes
        toks = sum(a.nbytes for t in self._tokens if t is not None for a in t if a is not None)
        return int(cols + toks)

    # --- persistence: plain arrays and ints only, no pickled objects -------------------------------
    def state_dict(self) -> dict[str, Any]:
        slots = self.valid_slots()
        toks = [self._tokens[s] for s in slots.tolist()]
        has_ref = bool(toks) and toks[0][4] is not None
        state: dict[str, Any] = {f"col.{k}": v.copy() for k, v in self._cols.items()}
        state.update(
            valid=self.valid.copy(),
            free=np.asarray(self._free, dtype=np.int64),
            count=self._count,
            seq=self._seq,
            prompt_len=np.array([len(t[0]) for t in toks], dtype=np.int64),
            comp_len=np.array([len(t[1]) for t in toks], dtype=np.int64),
            prompt_ids=_cat([t[0] for t in toks], np.int32),
            comp_ids=_cat([t[1] for t in toks], np.int32),
            logps=_cat([t[2] for t in toks], np.float32),
            mask=_cat([t[3] for t in toks], np.bool_),
            has_ref=has_ref,
            ref=_cat([t[4] for t in toks], np.float32) if has_ref else np.zeros(0, np.float32),
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._cols = {k: np.array(state[f"col.{k}"], dtype=dt) for k, dt in COLUMNS.items()}
        self.valid = np.array(state["valid"], dtype=bool)
        self._free = [int(x) for x in state["free"]]
        self._count = int(state["count"])
        self._seq = int(state["seq"])
        self._tokens = [None] * len(self.valid)
        n = self._count
        pcut, ccut = np.cumsum(state["prompt_len"])[:-1], np.cumsum(state["comp_len"])[:-1]
        split = lambda k, dt, cut: np.split(np.asarray(state[k], dt), cut) if n else []  # noqa: E731
        prompts, comps = split("prompt_ids", np.int32, pcut), split("comp_ids", np.int32, ccut)
        logps, mask = split("logps", np.float32, ccut), split("mask", bool, ccut)
        ref = split("ref", np.float32, ccut) if bool(state["has_ref"]) else [None] * n
        for i, s in enumerate(self.valid_slots().tolist()):
            self._tokens[s] = (prompts[i], comps[i], logps[i], mask[i], ref[i])


def _cat(arrays: list, dtype) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)
