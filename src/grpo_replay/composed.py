"""`ComposedBatch`: an update batch kept as its segments (the fresh rows, then the replay rows), not copied into one.

Why: fresh-anchored composition puts the whole fresh batch next to the replay rows. Copying both into one
padded batch is bounded by memory traffic on the CPU (the paper default's 768 rows x 2,048 positions are
15 MB in the narrow form, 35 MB in int64) and buys nothing the consumers need: the built-in trainer cuts
the update into micro-batches anyway (`micro_batches`: views of one segment each, no copy), and the TRL and
verl integrations take only the replay rows out of it (`select`, which copies only the rows asked for).

What a consumer sees: a `ComposedBatch` is a `RolloutBatch`. Its per-row fields (advantages, rewards, group
ids, birth steps, is_replay) are concatenated at once (B values each); its token fields (`completion_ids`,
`behaviour_logps`, ...) are the padded concatenation, built by `RolloutBatch.concat` on first access and
cached, so code that reads them sees the one padded batch, paying for the copy once.

The segments share the tensors of the batches they were made from (the caller's fresh batch among them):
modify neither in place while the composed batch is in use (replacing a field, `fresh.x = ...`, is fine).
"""
from __future__ import annotations

import dataclasses
from typing import Iterator, Optional, Sequence

import torch

from .rollout import TOKEN_FIELDS, RolloutBatch, cat_buffer_seq, unchecked_batch

_FIELDS = dataclasses.fields(RolloutBatch)
_ROW_FIELDS = tuple(f.name for f in _FIELDS if f.name not in TOKEN_FIELDS)


class ComposedBatch(RolloutBatch):
    """The rows of `parts`, in order, as one `RolloutBatch` whose token fields are concatenated only when read.

    `parts`: the non-empty segments (at least one, possibly empty, is kept), all with or all without
    reference log-probs."""

    def __init__(self, parts: Sequence[RolloutBatch]):  # noqa: D107 (not the dataclass __init__: no token fields)
        parts = [q for p in parts for q in (p.parts if isinstance(p, ComposedBatch) else (p,))]  # flat
        parts = [p for p in parts if len(p) > 0] or list(parts[:1])
        if not parts:
            raise ValueError("ComposedBatch: needs at least one batch")
        if len({p.ref_logps is not None for p in parts}) > 1:
            raise ValueError("ComposedBatch: ref_logps present in some batches but not all")
        # Own shallow copies: reassigning a field of the caller's batch later does not change this one.
        # (Copied attribute by attribute, not through the constructor: the batches were checked when made.)
        self.parts = tuple(unchecked_batch({f.name: getattr(p, f.name) for f in _FIELDS}) for p in parts)
        self._dense: Optional[RolloutBatch] = None
        for name in _ROW_FIELDS:
            ts = [getattr(p, name) for p in self.parts]
            if name == "buffer_seq":  # optional: fresh segments carry none
                setattr(self, name, cat_buffer_seq(self.parts) if len(ts) > 1 else ts[0])
            else:
                setattr(self, name, torch.cat(ts) if len(ts) > 1 else ts[0])

    def dense(self) -> RolloutBatch:
        """The padded concatenation of the segments (built once, then cached)."""
        if self._dense is None:
            self._dense = RolloutBatch.concat(self.parts)
        return self._dense

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def __repr__(self) -> str:
        return f"ComposedBatch({' + '.join(str(len(p)) for p in self.parts)} rows)"

    def completion_lengths(self) -> torch.Tensor:
        return torch.cat([p.completion_lengths() for p in self.parts])

    def prompt_lengths(self) -> torch.Tensor:
        return torch.cat([p.prompt_lengths() for p in self.parts])

    def completion_width(self) -> int:
        return max(p.completion_ids.shape[1] for p in self.parts)

    def micro_batches(self, size: Optional[int] = None) -> Iterator[RolloutBatch]:
        """Each segment's `micro_batches`: no micro-batch spans two segments, so none is copied."""
        for p in self.parts:
            yield from p.micro_batches(size)

    def select(self, idx: torch.Tensor | Sequence[int]) -> RolloutBatch:
        """Rows `idx` as a plain batch. Ascending rows (e.g. every replay row) are taken from their segments,
        copying only them; any other order goes through the concatenation."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        if len(idx) and (bool((idx[1:] < idx[:-1]).any()) or idx[0] < 0 or idx[-1] >= len(self)):
            return self.dense().select(idx)  # any order, negative indices, or the usual IndexError
        pieces, lo = [], 0
        for p in self.parts:
            hi = lo + len(p)
            mine = idx[(idx >= lo) & (idx < hi)]
            if len(mine) or not pieces and hi >= len(self):  # an empty selection keeps the last segment's widths
                pieces.append(p.select(mine - lo))
            lo = hi
        return pieces[0] if len(pieces) == 1 else RolloutBatch.concat(pieces)

    def to(self, device: torch.device | str) -> "ComposedBatch":
        return ComposedBatch([p.to(device) for p in self.parts])


def _token_field(name: str) -> property:
    def get(self: ComposedBatch) -> Optional[torch.Tensor]:
        if name == "ref_logps" and self.parts[0].ref_logps is None:  # none anywhere: nothing to concatenate
            return None
        return getattr(self.dense(), name)

    get.__doc__ = f"`{name}` of the padded concatenation (see `dense`)."
    return property(get)


for _name in TOKEN_FIELDS:
    setattr(ComposedBatch, _name, _token_field(_name))
