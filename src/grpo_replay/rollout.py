"""The padded batch that flows from generation through the buffer to the loss.

`RolloutBatch` holds B rows; prompts are left-padded to width P, completions right-padded to width C.
Fresh rows come from generation; replay rows come from `ReplayBuffer.sample`; `RolloutBatch.concat`
re-pads both to shared widths. Padding positions carry mask 0 and are ignored by the loss.

Token ids may be int32 or int64 and masks bool or any integer dtype. The buffer hands out the narrow form
(int32 ids, bool masks: what it stores), and the built-in trainer's generation produces it, because every
step copies these tensors several times (insert, draw, concatenation) and the copies are bounded by memory
traffic: the narrow form is 9 bytes a completion position instead of 20. Consumers that need int64 (an
embedding lookup's caller, `torch.gather`) cast at the model, one micro-batch at a time (`token_logps`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

PAD_ID = 0  # token id written into padding positions; masks make its value irrelevant


@dataclass
class RolloutBatch:
    """B rollouts as padded tensors: prompts left-padded to width P, completions right-padded to width C.

    Invariants (shapes checked at construction): token fields are 2-D and per-row fields 1-D, all with B
    rows; positions with mask 0 are padding, ignored by the loss; rows of one group share a group id;
    fresh rows have is_replay False and birth_step = the step that generated them.
    """

    prompt_ids: torch.Tensor  # (B, P) int32 or long, left-padded
    prompt_mask: torch.Tensor  # (B, P) bool or integer, nonzero = real token
    completion_ids: torch.Tensor  # (B, C) int32 or long, right-padded
    completion_mask: torch.Tensor  # (B, C) bool, or 0/1 in any dtype: 1 = token the loss counts
    behaviour_logps: torch.Tensor  # (B, C) float32, log pi_behaviour(token) at generation time
    advantages: torch.Tensor  # (B,) float32, frozen group-relative advantage A_i
    rewards: torch.Tensor  # (B,) float32
    group_ids: torch.Tensor  # (B,) long; rows of one group share it (unique within a batch)
    group_std: torch.Tensor  # (B,) float32, sigma_g of the row's group
    birth_step: torch.Tensor  # (B,) long, optimizer step at which the row was generated
    is_replay: torch.Tensor  # (B,) bool
    ref_logps: Optional[torch.Tensor] = None  # (B, C) float32, reference-policy log-probs (only when KL is used)
    # (B,) long: a replayed row's insertion number in the buffer it came from, -1 for a fresh row; None when no
    # row came from a buffer. It names the stored row (slots are reused), so the caller can evict exactly it.
    buffer_seq: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        # Shapes only (no pass over the values): a 2-D reward or a 1-D mask would otherwise surface later
        # as a raw torch broadcasting or indexing error far from its cause.
        for f in dataclasses.fields(self):
            t = getattr(self, f.name)
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"RolloutBatch.{f.name} must be a torch.Tensor, got {type(t).__name__}")
            dim = 2 if f.name in TOKEN_FIELDS else 1
            if t.dim() != dim:
                what = "(B, width)" if dim == 2 else "(B,), one value per row"
                raise ValueError(f"RolloutBatch.{f.name} must be {dim}-D {what}; got shape {tuple(t.shape)}")
        b = self.prompt_ids.shape[0]
        for f in dataclasses.fields(self):
            t = getattr(self, f.name)
            if t is not None and t.shape[0] != b:
                raise ValueError(f"RolloutBatch.{f.name} has {t.shape[0]} rows, prompt_ids has {b}")

    @classmethod
    def fresh(
        cls,
        *,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        advantages: torch.Tensor,
        rewards: torch.Tensor,
        group_ids: torch.Tensor,
        group_std: torch.Tensor,
        step: int,
        behaviour_logps: Optional[torch.Tensor] = None,
        ref_logps: Optional[torch.Tensor] = None,
    ) -> "RolloutBatch":
        """Rows generated at optimizer step `step`: birth_step = step, is_replay = False.

        behaviour_logps None = zeros of the completion's shape, for a caller that reads them off the update's
        own forward pass later (the policy has not moved between generation and that pass)."""
        n = completion_ids.shape[0]
        return cls(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            behaviour_logps=torch.zeros(completion_ids.shape) if behaviour_logps is None else behaviour_logps,
            advantages=advantages,
            rewards=rewards,
            group_ids=group_ids,
            group_std=group_std,
            birth_step=torch.full((n,), int(step), dtype=torch.long),
            is_replay=torch.zeros(n, dtype=torch.bool),
            ref_logps=ref_logps,
        )

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    def age(self, step: int) -> torch.Tensor:
        """(B,) long: step - birth_step (0 for fresh rows)."""
        return step - self.birth_step

    def select(self, idx: torch.Tensor | Sequence[int]) -> "RolloutBatch":
        idx = torch.as_tensor(idx, dtype=torch.long)
        return RolloutBatch(**{f.name: _take(getattr(self, f.name), idx) for f in dataclasses.fields(self)})

    def micro_batches(self, size: Optional[int] = None) -> Iterator["RolloutBatch"]:
        """Consecutive runs of at most `size` rows (all rows when None), in order, as batches of views (no
        copy): replace a field of one rather than modifying it in place."""
        n = len(self)
        size = size or max(n, 1)
        if size >= n > 0:  # the whole batch: a shallow copy (slicing a dozen tensors costs ~50 us)
            yield unchecked_batch({f.name: getattr(self, f.name) for f in dataclasses.fields(RolloutBatch)})
            return
        for i in range(0, n, size):
            yield unchecked_batch({f.name: (None if (t := getattr(self, f.name)) is None else t[i : i + size])
                              for f in dataclasses.fields(RolloutBatch)})

    def completion_width(self) -> int:
        """C, the padded completion width."""
        return int(self.completion_ids.shape[1])

    def to(self, device: torch.device | str) -> "RolloutBatch":
        return RolloutBatch(
            **{f.name: (None if (t := getattr(self, f.name)) is None else t.to(device)) for f in dataclasses.fields(self)}
        )

    def completion_lengths(self) -> torch.Tensor:
        """(B,) long: index of the last counted completion token + 1 (0 for an empty completion)."""
        return mask_lengths(self.completion_mask)

    def prompt_lengths(self) -> torch.Tensor:
        return self.prompt_mask.sum(1)

    @staticmethod
    def concat(batches: Sequence["RolloutBatch"]) -> "RolloutBatch":
        """Concatenate rows, re-padding prompts on the left and completions on the right to shared widths."""
        batches = [b for b in batches if len(b) > 0] or list(batches[:1])
        if len(batches) == 1:
            return batches[0]
        has_ref = [b.ref_logps is not None for b in batches]
        if any(has_ref) and not all(has_ref):
            raise ValueError("RolloutBatch.concat: ref_logps present in some batches but not all")
        out = {}
        for f in dataclasses.fields(RolloutBatch):
            ts = [getattr(b, f.name) for b in batches]
            if f.name == "buffer_seq":
                out[f.name] = cat_buffer_seq(batches)
            elif ts[0] is None:
                out[f.name] = None
            elif ts[0].dim() == 2:
                out[f.name] = cat_padded(ts, left=f.name in ("prompt_ids", "prompt_mask"))
            else:
                out[f.name] = torch.cat(ts)
        return RolloutBatch(**out)


def cat_buffer_seq(batches: Sequence["RolloutBatch"]) -> Optional[torch.Tensor]:
    """The batches' `buffer_seq` concatenated, -1 for the rows of a batch without one (None if none has one)."""
    ts = [b.buffer_seq for b in batches]
    if all(t is None for t in ts):
        return None
    return torch.cat([torch.full((len(b),), -1, dtype=torch.long) if t is None else t for b, t in zip(batches, ts)])


def cat_padded(
    tensors: Sequence[torch.Tensor], left: bool, value: float = PAD_ID, multiple: Optional[int] = None
) -> torch.Tensor:
    """Rows of 2-D tensors stacked, each padded with `value` to the widest (rounded up to a multiple of
    `multiple` when given): on the left (`left`, for prompts) or on the right (completions). The one
    padded concatenation of the project: one uninitialised allocation, each part copied once into its
    slice and only the padding written besides (pad-then-cat would copy twice, zero-filling first would
    write twice); `torch.cat` when no padding is needed. Mixed dtypes (int64 fresh ids next to the
    buffer's int32 ones) give the promoted dtype, as `torch.cat` does."""
    W = max(t.shape[1] for t in tensors)
    if multiple:
        W = -(-W // multiple) * multiple
    first = tensors[0]
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if all(t.shape[1] == W and t.dtype == dtype and t.device == first.device for t in tensors):
        return torch.cat(list(tensors))
    res = first.new_empty((sum(t.shape[0] for t in tensors), W), dtype=dtype)
    row = 0
    for t in tensors:
        n, w = t.shape
        part = res[row : row + n]
        if left:
            part[:, : W - w].fill_(value)
            part[:, W - w :] = t
        else:
            part[:, :w] = t
            part[:, w:].fill_(value)
        row += n
    return res


TOKEN_FIELDS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "behaviour_logps", "ref_logps")
MAX_TOKEN_ID = 2**31 - 1  # the buffer stores token ids as int32


def check_token_ids(batch: RolloutBatch, where: str) -> None:
    """Raise ValueError if a stored token id (real prompt tokens, completion tokens up to the last counted
    one) lies outside [0, 2**31 - 1]: the buffer keeps int32 ids and would silently truncate it."""
    if batch.prompt_mask.shape != batch.prompt_ids.shape:
        raise ValueError(
            f"{where}: prompt_mask has shape {tuple(batch.prompt_mask.shape)}, prompt_ids has "
            f"{tuple(batch.prompt_ids.shape)}; they must match"
        )
    for name in ("prompt_ids", "completion_ids"):
        dtype = getattr(batch, name).dtype
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:  # a cast would truncate 3.7 to 3
            raise ValueError(f"{where}: {name} has dtype {dtype}; allowed: an integer dtype (torch.int32 or torch.int64)")
    # Fast path: one min/max pass over every position (padding included). Only when that finds an id out of
    # range (padding may hold any value, e.g. -100) are the real tokens selected and checked precisely.
    if all(_in_int32_range(t) for t in (batch.prompt_ids, batch.completion_ids)):
        return
    for ids, keep in (
        (batch.prompt_ids, batch.prompt_mask.ne(0)),
        (batch.completion_ids, torch.arange(batch.completion_ids.shape[1], device=batch.completion_ids.device).unsqueeze(0)
         < mask_lengths(batch.completion_mask).unsqueeze(1)),
    ):
        real = ids[keep]
        if real.numel() == 0:
            continue
        lo, hi = int(real.min()), int(real.max())
        if lo < 0 or hi > MAX_TOKEN_ID:
            name = "prompt_ids" if ids is batch.prompt_ids else "completion_ids"
            raise ValueError(
                f"{where}: {name} holds token id {hi if hi > MAX_TOKEN_ID else lo}; "
                f"allowed: 0 <= id <= {MAX_TOKEN_ID} (the buffer stores int32 token ids)"
            )


def nonfinite_logp_rows(batch: RolloutBatch) -> torch.Tensor:
    """(B,) bool: the rows whose behaviour or reference log-probs are NaN or inf at a counted token. The buffer
    refuses such rows (their importance ratio is undefined, and a saved buffer holding one cannot be loaded);
    `ReplaySession.flush` leaves them out of every trainer's insert and counts them."""
    counted = batch.completion_mask.ne(0)
    bad = torch.zeros(counted.shape[0], dtype=torch.bool, device=counted.device)
    for t in (batch.behaviour_logps, batch.ref_logps):
        if t is not None:
            bad |= (~torch.isfinite(t) & counted.to(t.device)).any(dim=1).to(bad.device)
    return bad


def check_completion_mask(mask: torch.Tensor, where: str) -> None:
    """Raise ValueError unless every entry of a completion mask is 0 or 1 (any dtype; bool passes at once).

    The mask says which tokens count; it is not a loss weight. The buffer keeps it as bool, so a 2 would
    weigh a fresh row's token twice and the same row, replayed, once."""
    if mask.dtype == torch.bool or mask.numel() == 0:
        return
    off = (mask != 0) & (mask != 1)
    if bool(off.any()):
        value = mask[off][0].item()
        raise ValueError(f"{where}: completion_mask holds {value!r}; allowed: 0 or 1 (or bool)")


_UNSIGNED_VIEW = {np.dtype(np.int64): np.uint64, np.dtype(np.int32): np.uint32}


def ids_fit_int32(ids: np.ndarray) -> bool:
    """True if every entry of int32 or int64 `ids` lies in [0, MAX_TOKEN_ID]: one max, a negative id being
    huge unsigned."""
    return ids.size == 0 or int(ids.view(_UNSIGNED_VIEW[ids.dtype]).max()) <= MAX_TOKEN_ID


def _in_int32_range(ids: torch.Tensor) -> bool:
    """True if every entry of `ids` (any integer dtype) lies in [0, MAX_TOKEN_ID]."""
    if ids.dtype in (torch.int64, torch.int32):  # one max on the host
        try:
            return ids_fit_int32(ids.numpy())
        except (RuntimeError, TypeError):  # on another device, or requiring grad
            pass
    if ids.numel() == 0:
        return True
    lo, hi = torch.aminmax(ids)
    return int(lo) >= 0 and int(hi) <= MAX_TOKEN_ID


def unchecked_batch(fields: dict[str, Optional[torch.Tensor]]) -> RolloutBatch:
    """A batch of these fields without `__post_init__`'s checks: for views and shallow copies of a batch that
    passed them (the checks cost more than the rest of a micro-batch's bookkeeping)."""
    out = object.__new__(RolloutBatch)
    out.__dict__.update(fields)
    return out


def _take(t: Optional[torch.Tensor], idx: torch.Tensor) -> Optional[torch.Tensor]:
    return None if t is None else t[idx.to(t.device)]


def mask_lengths(mask: torch.Tensor) -> torch.Tensor:
    """(B,) long: index of the last nonzero entry of each row + 1 (0 for an all-zero row)."""
    if mask.shape[1] == 0:
        return torch.zeros(mask.shape[0], dtype=torch.long)
    pos = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask.ne(0).long() * pos).max(1).values
