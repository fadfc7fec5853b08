"""Padded completion storage (the default): one preallocated row per slot in each field's arena.

int32 completion ids, float32 behaviour log-probs and (when the rows carry them) float32 reference log-probs
are left-aligned; the completion mask is packed 8 positions to a byte (`np.packbits`, first position in the
high bit), except for rows whose mask is exactly their first comp_len positions (`dense`, the usual case):
the storage rebuilds their mask from comp_len and their mask row is not written. An insert is one copy of
the batch per field, narrowed to that batch's own width, and a draw one row gather per field (no unpad on
insert, no re-pad on draw); the price is padding: each row takes the arena's width, the longest row stored
so far. Positions past a row's length (its last counted token) keep what the fresh batch held there
(padding, masked out like the fresh row's own) up to that batch's width, and zeros beyond; they are not
saved, so a loaded arena has zeros there.

`PaddedArena` and `ragged.RaggedArena` (the unpadded layout) answer the same calls, so `RolloutStorage` holds
one of them and does not ask which.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .padding import RowWriter, packed_width, prefix_rows, repad, resize_rows, row_gather

# arena name -> dtype ("mask" holds packed bits: 8 completion positions a byte)
COMPLETION_FIELDS: dict[str, Any] = {"comp_ids": np.int32, "mask": np.uint8, "logps": np.float32, "ref": np.float32}


class PaddedArena:
    """One (slots, width) array per `COMPLETION_FIELDS` entry (`arrays`).

    Invariants: every array has a row per slot; comp_ids and logps are `width` wide and the mask
    packed_width(width) bytes; the ref array is as wide once rows carried reference log-probs, 0 until then;
    an occupied slot's row holds its first comp_len positions (the mask only for a row that is not dense)."""

    def __init__(self, slots: int):
        self.arrays = {k: np.zeros((slots, 0), dt) for k, dt in COMPLETION_FIELDS.items()}
        self.width = 0  # completion positions of the widest arena (the ref arena may be narrower, the mask's packed)

    def resize_slots(self, slots: int) -> None:
        self.arrays = {k: resize_rows(a, slots) for k, a in self.arrays.items()}

    def widen(self, width: int, has_ref: bool) -> None:
        """Grow the arrays to at least `width` positions, keeping their rows left-aligned."""
        self.width = max(self.width, width)
        for k, a in self.arrays.items():
            W = packed_width(width) if k == "mask" else width
            if W > a.shape[1] and (k != "ref" or has_ref):  # no reference log-probs: no ref arena
                new = np.zeros((len(a), W), a.dtype)
                new[:, : a.shape[1]] = a
                self.arrays[k] = new

    def put(self, rows: RowWriter, lengths: np.ndarray, completion: dict[str, Optional[np.ndarray]]) -> None:
        """Write `RolloutStorage.add`'s completion input at the writer's slots (the mask only when given:
        None means every row is dense); `lengths` is not needed, the rows are copied whole."""
        if completion["mask"] is not None:
            rows.put(self.arrays["mask"], completion["mask"])
        for k in ("comp_ids", "logps", "ref"):
            if completion.get(k) is not None:
                rows.put(self.arrays[k], completion[k])

    def release(self, slots: np.ndarray) -> None:
        """Nothing to do: `put` overwrites a row's whole width before it is read again."""

    def gather(self, names: list[str], slots: np.ndarray, lengths: np.ndarray, width: int) -> dict[str, np.ndarray]:
        """(len(slots), width) arrays of the named fields: the rows' first `width` positions as stored."""
        return {k: row_gather(self.arrays[k], slots, 0, width) for k in names}

    def masks(self, slots: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
        """(len(slots), width) bool: the packed masks of these (not dense) rows, unpacked."""
        return np.unpackbits(self.arrays["mask"][slots, : packed_width(width)], axis=1, count=width).view(np.bool_)

    def row(self, name: str, slot: int, length: int) -> np.ndarray:
        """One row's first `length` values of a field: a view."""
        return self.arrays[name][slot, :length]

    def flat(self, name: str, slots: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The rows' values of one field, each row's first lengths[i] positions, concatenated."""
        a = self.arrays[name][slots]
        return a[prefix_rows(lengths, a.shape[1])]

    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays.values()))

    def saved_widths(self, has_ref: Optional[bool]) -> dict[str, int]:
        """The allocated width of each array (the mask's in packed bytes), as the saved state records them."""
        return {k: int(a.shape[1]) for k, a in self.arrays.items()}

    def load(self, state: dict[str, Any], slots: np.ndarray, lengths: np.ndarray, widths: dict[str, int],
             has_ref: Optional[bool]) -> np.ndarray:
        """Fill this (new) arena from a saved state's concatenated completions of the rows at `slots`, the
        arrays `widths` wide; returns which of those rows are dense."""
        n_slots = len(self.arrays["comp_ids"])
        C = int(lengths.max()) if len(lengths) else 0
        self.width = widths["comp_ids"]
        for k, dt in COMPLETION_FIELDS.items():
            self.arrays[k] = np.zeros((n_slots, widths[k]), dt)
            if k in ("comp_ids", "logps") or (k == "ref" and has_ref):
                self.arrays[k][slots] = repad(state[k], lengths, widths[k], dt, left=False)
        mask = repad(state["mask"], lengths, C, np.bool_, left=False)
        self.arrays["mask"][slots, : packed_width(C)] = np.packbits(mask, axis=1)
        return np.count_nonzero(mask, axis=1) == lengths
