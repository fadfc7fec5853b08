"""`ReplayBuffer`: stores rollouts, evicts by age (and capacity), samples by priority.

Glue over small parts: `RolloutStorage` (what is kept), two `Eviction`s (what is dropped: `AgeEviction`
before each draw, `CapacityEviction` after each insert) and a `Sampler` (what is drawn), each with
state_dict/load_state_dict (`parts.BufferPart`); the priority (`PRIORITIES`) weighs rows at insertion.
Advantages, group statistics, behaviour log-probs and the sampling weight are frozen at insertion
(docs/method.md).
"""
from __future__ import annotations

import math
import os
from typing import Any, Optional, Sequence

import numpy as np
import torch

from . import buffer_state
from . import metric_names as mn
from .buffer_state import STATE_VERSION, BufferStateError, BufferTotals
from .config import ReplayConfig
from .eviction import AgeEviction, CapacityEviction, Eviction
from .priority import PRIORITIES
from .rollout import RolloutBatch, check_completion_mask, check_token_ids, ids_fit_int32, unchecked_batch
from .sampler import GroupPrioritizedSampler, PrioritizedSampler, Sampler
from .storage import RolloutStorage, encode_rows

__all__ = ["ReplayBuffer", "BufferStateError", "STATE_VERSION"]


class ReplayBuffer:
    """Fresh rollouts kept for replay, each with its birth step, frozen advantage and sampling weight.

    Holds a `RolloutStorage`, an age and a capacity `Eviction`, a `Sampler`, the priority function named by
    the config, the seeded generator the sampler draws from, and counters. Invariants: no stored row was
    born after `last_step`; `totals.added == len(self) + totals.evicted()` (`BufferTotals`, also read as
    `total_added`, `total_evicted_age`, ...); group
    keys are unique across inserts (and insertion numbers, `seq`, across the buffer's life); a saved and reloaded buffer draws exactly what the original would.
    With `report_evictions`, the insertion numbers of the rows evicted by any path (age, capacity, max_uses,
    `evict_rows`) are kept until `take_evicted` reads them (an integration that keeps rows elsewhere drops those).
    The parts default to the config's (`granularity: group` gives `GroupPrioritizedSampler` and whole-group
    capacity eviction); pass `sampler=`, `age_eviction=` or `capacity_eviction=` to replace one, and
    `storage=RolloutStorage(unpadded=True)` (empty) to keep completions without padding.
    """

    def __init__(
        self,
        config: Optional[ReplayConfig] = None,
        seed: int = 0,
        *,
        sampler: Optional[Sampler] = None,
        age_eviction: Optional[Eviction] = None,
        capacity_eviction: Optional[Eviction] = None,
        storage: Optional[RolloutStorage] = None,
        report_evictions: bool = False,
    ):
        self.config = config or ReplayConfig()
        by_group = self.config.granularity == "group"
        self.rng = np.random.default_rng(seed)
        self.storage = storage if storage is not None else RolloutStorage()
        self.age_eviction = age_eviction or AgeEviction(self.config.tau_max)
        self.capacity_eviction = capacity_eviction or CapacityEviction(self.config.capacity, whole_groups=by_group)
        sampler_cls = GroupPrioritizedSampler if by_group else PrioritizedSampler
        self.sampler = sampler or sampler_cls(self.config.replacement)
        self._priority = PRIORITIES.get(self.config.priority)
        self._next_group = 0
        self.totals = BufferTotals()
        self.last_step: Optional[int] = None  # newest step passed to add/evict/sample: no birth step is later
        self.report_evictions = report_evictions
        self._evicted: list[np.ndarray] = []  # insertion numbers evicted since `take_evicted` (report_evictions)

    def __len__(self) -> int:
        return len(self.storage)

    # the lifetime counts (`totals`) by their attribute names
    total_added = property(lambda self: self.totals.added)
    total_evicted_age = property(lambda self: self.totals.evicted_age)
    total_evicted_capacity = property(lambda self: self.totals.evicted_capacity)
    total_evicted_uses = property(lambda self: self.totals.evicted_uses)
    total_evicted_drift = property(lambda self: self.totals.evicted_drift)

    # --- Algorithm 1 step 7 -------------------------------------------------------------------------
    def add(self, batch: RolloutBatch, step: Optional[int] = None, prompt_keys: Optional[Sequence[int]] = None,
            seqs: Optional[Sequence[int]] = None) -> int:
        """Insert fresh rows. Returns rows added. Each row's birth step is its `batch.birth_step` (rows of
        several steps may come in one call), or `step` for every row when given. `seqs`: (n,) the rows' insertion
        numbers, reserved before (`reserve`), distinct, each used once; None: the next n (`next_seq`).

        Rows are stored in padded arenas (storage.py): prompts compacted to the tokens where prompt_mask
        is 1, completions as they are, up to the longest. Group ids are mapped to buffer-wide keys, so ids
        may repeat across calls. Rows may arrive late (a step earlier than one already drawn at): they keep
        their birth step. Atomic: every check runs before anything changes, so an add that raises leaves
        the buffer (and what `save` writes) as it was.
        """
        n = len(batch)
        if n == 0:
            return 0
        births, newest = _births(batch, step)
        a = _fresh_arrays(batch)
        pk = _prompt_keys(prompt_keys, n)
        seqs = None if seqs is None else self._reserved(seqs, n)
        inv, n_groups = _group_index(a["group_ids"])
        rows = encode_rows(a["prompt_ids"], a["prompt_mask"], a["completion_ids"], a["completion_mask"],
                           a["behaviour_logps"], a["ref_logps"])
        columns = {
            "birth_step": births if isinstance(births, np.ndarray) else np.full(n, births, np.int64),
            "advantage": a["advantages"],
            "reward": a["rewards"],
            "group_std": a["group_std"],
            "group_key": self._next_group + inv,
            "prompt_key": pk,
            "prompt_len": rows.prompt_len,
            "comp_len": rows.comp_len,
        }
        weight = np.asarray(self._priority(columns, self.config), dtype=np.float64)
        # min >= 0 fails for NaN too, max < inf for inf: two reductions, no temporary
        if weight.shape != (n,) or not (np.minimum.reduce(weight) >= 0 and np.maximum.reduce(weight) < np.inf):
            raise ValueError(
                f"ReplayBuffer.add: priority {self.config.priority!r} must give {n} finite weights >= 0, "
                f"got shape {weight.shape}"
            )
        # Everything is checked: from here on the buffer changes.
        # The storage takes one birth step as it is, and no prompt keys when there are none (all -1).
        stored = {**columns, "birth_step": births, "weight": weight}
        if prompt_keys is None:
            del stored["prompt_key"]
        self.storage.add(stored, rows.prompt_ids, rows.completion, rows.prompt_mask, seqs=seqs)
        self._next_group += n_groups
        self._see(newest)
        self.totals.added += n
        evict = self.capacity_eviction.select(self.storage, self.last_step)
        self._drop(evict)
        self.totals.evicted_capacity += len(evict)
        return n

    def reserve(self, n: int) -> np.ndarray:
        """(n,) int64: the next n insertion numbers, handed out now for rows an `add(seqs=...)` inserts later
        (`ReplaySession.defer`); a number never used leaves a gap, and later adds number past it."""
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"ReplayBuffer.reserve: n={n!r} is invalid; allowed: an integer >= 0 (rows)")
        return self.storage.reserve(int(n))

    def _reserved(self, seqs: Sequence[int], n: int) -> np.ndarray:
        """`seqs` as (n,) int64 after checking they are distinct numbers `reserve` handed out."""
        s = np.asarray(seqs.cpu() if isinstance(seqs, torch.Tensor) else seqs)
        if s.shape != (n,) or s.dtype.kind not in "iu":
            raise ValueError(f"ReplayBuffer.add: seqs has shape {s.shape} and dtype {s.dtype}; allowed: {n} integers, "
                             "one per row")
        s = s.astype(np.int64)
        if n and (int(s.min()) < 0 or int(s.max()) >= self.next_seq or len(np.unique(s)) != n):
            raise ValueError(f"ReplayBuffer.add: seqs must be distinct numbers below next_seq={self.next_seq} handed "
                             f"out by reserve; got {s[:5].tolist()}...")
        return s

    def _drop(self, slots: np.ndarray) -> None:
        """Remove stored rows; with `report_evictions`, their insertion numbers wait for `take_evicted`."""
        if self.report_evictions and len(slots):
            self._evicted.append(self.storage.col("seq")[slots].copy())
        self.storage.remove(slots)

    def take_evicted(self) -> np.ndarray:
        """(k,) int64: the insertion numbers of the rows evicted by any path (age, capacity, max_uses,
        `evict_rows`) since the last call, in eviction order; O(k). Needs `report_evictions=True` (RuntimeError
        otherwise). A loaded buffer starts with none."""
        if not self.report_evictions:
            raise RuntimeError("ReplayBuffer.take_evicted: this buffer was built without report_evictions=True")
        out = np.concatenate(self._evicted) if self._evicted else np.zeros(0, np.int64)
        self._evicted = []
        return out

    # --- Algorithm 1 steps 4-5 ----------------------------------------------------------------------
    def evict(self, step: int) -> int:
        """Drop every rollout with age > tau_max at `step`. Returns rows evicted.

        Raises ValueError if a stored row was born after `step` (its age would be negative): draws and
        evictions are made at steps no earlier than the rows they see."""
        step = _step_arg(step, "ReplayBuffer.evict")
        if self.last_step is not None and step < self.last_step:  # rare: only then can a birth be later
            births = self.storage.col("birth_step")[self.storage.valid_slots()]
            if len(births) and int(births.max()) > step:
                raise ValueError(
                    f"ReplayBuffer: step {step} is before the birth step {int(births.max())} of stored rows; "
                    f"draw and evict at a step >= every stored row's birth step (ages are never negative)"
                )
        self._see(step)
        slots = self.age_eviction.select(self.storage, step)
        self._drop(slots)
        self.totals.evicted_age += len(slots)
        return len(slots)

    def sample(self, n_rows: int, step: int) -> RolloutBatch:
        """Evict stale rows, then draw replay rows: exactly min(n_rows, len) at rollout granularity; whole
        groups of at most n_rows rows in all at group granularity (`GroupPrioritizedSampler`). Empty during
        warm-up, when replay is off, or when the buffer is empty. With age_decay the stored weights are
        multiplied by exp(-age / age_decay) for this draw; with max_uses each drawn row's replay count goes
        up by one and the rows that reach it are evicted after being gathered (otherwise sampling never
        removes a rollout). Raises ValueError like `evict` for a step before a stored row's birth."""
        if isinstance(n_rows, (bool, np.bool_)) or not isinstance(n_rows, (int, np.integer)) or n_rows < 0:
            raise ValueError(f"ReplayBuffer.sample: n_rows={n_rows!r} is invalid; allowed: an integer >= 0 (rows to draw)")
        self.evict(step)
        if step < self.config.warmup_steps or not self.config.enabled:
            n_rows = 0
        weights = self._decayed_weights(step) if self.config.age_decay is not None and n_rows > 0 else None
        if weights is None:  # the paper's draw: the sampler's own weights, the same calls as without the option
            slots = self.sampler.sample(self.storage, n_rows, self.rng)
        else:
            slots = self.sampler.sample(self.storage, n_rows, self.rng, weights=weights)
        batch = self.gather(slots)
        if self.config.max_uses is not None and len(slots):
            uses = self.storage.col("uses")
            np.add.at(uses, slots, 1)  # with replacement a row drawn twice counts twice
            spent = np.unique(slots[uses[slots] >= self.config.max_uses])
            self._drop(spent)
            self.totals.evicted_uses += len(spent)
        return batch

    def _decayed_weights(self, step: int) -> np.ndarray:
        """Per-slot weights times exp(-age / age_decay). The exponent is taken relative to the youngest stored
        row: a common factor leaves the draw's probabilities as they are and keeps old rows from underflowing
        all at once."""
        st = self.storage
        births = st.col("birth_step")
        newest = int(births[st.valid].max()) if len(st) else step
        return st.col("weight") * np.exp(-(newest - births).clip(min=0) / self.config.age_decay)

    def evict_rows(self, seqs: Any) -> int:
        """Evict the stored rows with these insertion numbers (a replayed batch's `buffer_seq`: the caller
        measured them too far from the current policy, `ReplayConfig.max_drift`); numbers of rows no longer
        stored (already evicted) and -1 (fresh rows) are passed over. Returns rows evicted."""
        seqs = np.asarray(seqs.cpu() if isinstance(seqs, torch.Tensor) else seqs, dtype=np.int64).ravel()
        slots = self.storage.valid_slots()
        gone = slots[np.isin(self.storage.col("seq")[slots], seqs[seqs >= 0])]
        self._drop(gone)
        self.totals.evicted_drift += len(gone)
        return len(gone)

    def keys(self) -> tuple[np.ndarray, np.ndarray]:
        """(insertion numbers, prompt keys) of the stored rows, (n,) int64 each, in slot order. The insertion
        number is what every draw returns as `buffer_seq`: rows are numbered 0, 1, ... in the order their numbers
        were handed out (an add, or `reserve` ahead of it; a reserved number never added leaves a gap), unique over
        the buffer's life, through eviction and a reload (`next_seq`): an integration that keeps the rows' tokens
        elsewhere adds payload-free rows (zero-width token fields, the scalars only) and names each by its number."""
        return self.storage.keys()

    next_seq = property(lambda self: self.storage.next_seq, doc="The insertion number of the next row added.")

    def _see(self, step: int) -> None:
        step = int(step)
        self.last_step = step if self.last_step is None else max(self.last_step, step)

    def gather(self, slots: np.ndarray) -> RolloutBatch:
        """Padded replay batch of the given slots (prompts left-padded, completions right-padded, each to
        the longest among these rows; `RolloutStorage.rows`). Token fields come out in the stored, narrow
        form (int32 ids, bool masks; see rollout.py): widening them here would double the bytes written, and
        every consumer accepts them."""
        fields = self.storage.rows(np.asarray(slots, dtype=np.int64))
        # Built field by field with the shapes right by construction: RolloutBatch's checks are skipped.
        batch = {}
        for k, v in fields.items():  # is_replay after birth_step: the field order every replay batch has
            batch[k] = torch.from_numpy(v) if v is not None else None
            if k == "birth_step":
                batch["is_replay"] = torch.ones(len(slots), dtype=torch.bool)
        return unchecked_batch(batch)

    # --- diagnostics --------------------------------------------------------------------------------
    def stats(self, step: int) -> dict[str, Any]:
        slots = self.storage.valid_slots()
        ages = step - self.storage.col("birth_step")[slots]
        return {
            mn.BUFFER_SIZE: len(self),
            mn.BUFFER_MEAN_AGE: float(ages.mean()) if len(ages) else 0.0,
            mn.BUFFER_MAX_AGE: int(ages.max()) if len(ages) else 0,
            mn.BUFFER_AGE_HIST: np.bincount(ages.clip(min=0)).tolist() if len(ages) else [],
            mn.BUFFER_BYTES: self.storage.nbytes(),
            mn.BUFFER_EVICTED_AGE: self.totals.evicted_age,
            mn.BUFFER_EVICTED_CAPACITY: self.totals.evicted_capacity,
            # only with the option on: a default run's metrics rows keep their keys
            **({mn.BUFFER_EVICTED_USES: self.totals.evicted_uses} if self.config.max_uses is not None else {}),
            **({mn.BUFFER_EVICTED_DRIFT: self.totals.evicted_drift} if self.config.max_drift is not None else {}),
        }

    # --- persistence ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "config": self.config.to_dict(),
            "rng": self.rng.bit_generator.state,
            "next_group": self._next_group,
            "totals": self.totals.to_dict(),
            "step": self.last_step,
            "storage": self.storage.state_dict(),
            "sampler": self.sampler.state_dict(),
            "age_eviction": self.age_eviction.state_dict(),
            "capacity_eviction": self.capacity_eviction.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`; every field is validated first (BufferStateError, nothing changed)."""
        self._load_validated(state, {"json": "replay buffer state", "npz": "replay buffer state"})

    def _load_validated(self, state: dict[str, Any], where: dict[str, str]) -> None:
        parts = {"sampler": self.sampler, "age_eviction": self.age_eviction, "capacity_eviction": self.capacity_eviction}
        state = buffer_state.upgrade(state)
        buffer_state.validate(state, self.config, where, parts)
        self.rng.bit_generator.state = state["rng"]
        self._evicted = []
        self._next_group = int(state["next_group"])
        self.totals = BufferTotals(**buffer_state.totals(state["totals"], state["version"]))
        st = state["storage"]
        births = st["col.birth_step"][st["valid"]]
        # Version 1 files predate "step": their newest birth step is the best bound there is.
        step = state["step"] if "step" in state else (int(births.max()) if len(births) else None)
        self.last_step = None if step is None else int(step)
        self.storage.load_state_dict(st)
        self.sampler.load_state_dict(state["sampler"])
        self.age_eviction.load_state_dict(state["age_eviction"])
        self.capacity_eviction.load_state_dict(state["capacity_eviction"])

    def save(self, path: str | os.PathLike) -> None:
        """Write `<path>.npz` (arrays, allow_pickle=False) and `<path>.json` (everything else and a checksum),
        each atomically, creating missing parent directories. The extensions are appended to the whole name
        (`buffer.step1` is kept as it is); a path ending in .npz or .json names the same pair without it."""
        buffer_state.write(self.state_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike, config: Optional[ReplayConfig] = None, *,
             storage: Optional[RolloutStorage] = None, report_evictions: bool = False) -> "ReplayBuffer":
        """Read what `save(path)` wrote (into `storage` when given: the saved format does not depend on its
        layout). Any missing, corrupt, inconsistent or edited field raises BufferStateError naming the file and
        the field."""
        state, where = buffer_state.read(path)
        if config is None:
            cfg = state.get("config")
            try:
                config = ReplayConfig(**cfg) if isinstance(cfg, dict) else None
            except (TypeError, ValueError) as e:
                raise BufferStateError(f"{where['json']}: field 'config' is not a valid ReplayConfig: {e}") from None
            if config is None:
                raise BufferStateError(f"{where['json']}: field 'config' is missing or not an object")
        buf = cls(config, storage=storage, report_evictions=report_evictions)
        buf._load_validated(state, where)
        return buf


def _host(t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> np.ndarray:
    """`t` as a numpy array on the host, cast to `dtype` first if it differs (any torch dtype, bfloat16
    included): a view of a CPU tensor (no copy) where it can."""
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    try:
        return t.numpy()  # refused for a tensor on another device or one that requires grad
    except (RuntimeError, TypeError):
        return t.detach().cpu().numpy()


_FRESH_FIELDS = {"prompt_ids": None, "prompt_mask": None, "completion_ids": None, "completion_mask": None,
                 "behaviour_logps": torch.float32, "advantages": torch.float32, "rewards": torch.float32,
                 "group_std": torch.float32, "group_ids": None}
_WIDE_IDS = (torch.int32, torch.int64)


def check_fresh_rows(batch: RolloutBatch, where: str, prompt_keys: Optional[Sequence[int]] = None) -> np.ndarray:
    """Every check `add` makes of a batch and its prompt keys but one: log-probs that are NaN or inf at a counted
    token pass (`ReplaySession.flush` leaves such rows out, counted). Raises ValueError naming `where` and the field;
    returns the (n,) int64 prompt keys (-1 each when None)."""
    _births(batch, None, where)
    _fresh_arrays(batch, where, counted_logps=False)
    return _prompt_keys(prompt_keys, len(batch), where)


def _fresh_arrays(batch: RolloutBatch, where: str = "ReplayBuffer.add",
                  counted_logps: bool = True) -> dict[str, Optional[np.ndarray]]:
    """The fields `add` stores, as host numpy arrays (views where they can be; log-probs, advantages,
    rewards and group_std as float32), after every check on their values: no replay rows, completion-shaped
    masks and log-probs, token ids that fit int32, a 0/1 completion mask, finite advantages, group_std and
    rewards, finite log-probs at counted tokens.
    Raises ValueError naming the field (nothing is changed). The common case costs a few reductions: the
    precise checks (`check_token_ids`) run only when a fast one fails or the dtypes are unusual."""
    if np.count_nonzero(_host(batch.is_replay)):
        raise ValueError(f"{where}: batch holds replay rows; insert only fresh rows")
    shape = batch.completion_ids.shape
    for name in ("completion_mask", "behaviour_logps") + (("ref_logps",) if batch.ref_logps is not None else ()):
        if getattr(batch, name).shape != shape:
            raise ValueError(
                f"{where}: {name} has shape {tuple(getattr(batch, name).shape)}, completion_ids has {tuple(shape)}; "
                f"they must match"
            )
    pid, cid = batch.prompt_ids, batch.completion_ids
    usual = pid.dtype in _WIDE_IDS and cid.dtype in _WIDE_IDS and batch.prompt_mask.shape == pid.shape
    if not usual:
        check_token_ids(batch, where)  # refuses another dtype or shape before a float or bfloat16 reaches numpy
    check_completion_mask(batch.completion_mask, where)
    a = {k: _host(getattr(batch, k), dt) for k, dt in _FRESH_FIELDS.items()}
    a["ref_logps"] = _host(batch.ref_logps, torch.float32) if batch.ref_logps is not None else None
    if usual and not (ids_fit_int32(a["prompt_ids"]) and ids_fit_int32(a["completion_ids"])):
        check_token_ids(batch, where)  # raises, unless the ids outside int32 sit only in padding
    for k in ("advantages", "group_std", "rewards"):
        if not _finite(a[k]):
            bad = np.flatnonzero(~np.isfinite(a[k]))[:5].tolist()
            raise ValueError(f"{where}: {k} must be finite; rows {bad} are NaN or inf")
    if counted_logps:
        _check_counted_logps(a, where)
    return a


def _check_counted_logps(a: dict[str, Optional[np.ndarray]], where: str) -> None:
    """ValueError naming the field and rows when behaviour or reference log-probs are NaN or inf at a counted
    token (what `load` refuses, and a replayed row's importance ratio would be undefined). Padding may hold
    anything: the precise check runs only when the whole array is not finite."""
    for k in ("behaviour_logps", "ref_logps"):
        v = a[k]
        if v is None or _finite(v.reshape(-1)):
            continue
        rows = np.flatnonzero((~np.isfinite(v) & (a["completion_mask"] != 0)).any(axis=1))
        if len(rows):
            raise ValueError(
                f"{where}: {k} must be finite at counted tokens (completion_mask 1); rows {rows[:5].tolist()} hold "
                "NaN or inf there (a sampler's -inf under top-p/top-k, say); leave them out of the add "
                "(rollout.nonfinite_logp_rows finds them)"
            )


def _finite(a: np.ndarray) -> bool:
    """True if every entry is finite: a NaN or inf makes the sum non-finite, and a float64 sum of float32
    values cannot overflow."""
    return math.isfinite(np.add.reduce(a, dtype=np.float64))


def _step_arg(step: Any, where: str) -> int:
    """`step` as an int; a bool, a fraction or a non-number raises ValueError (a cast would truncate 3.7)."""
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
        raise ValueError(f"{where}: step={step!r} is invalid; allowed: an integer (the optimizer step)")
    return int(step)


def _births(batch: RolloutBatch, step: Any, where: str = "ReplayBuffer.add") -> tuple[Any, int]:
    """(the rows' birth steps: one int when they share it, else an (n,) int64 array; the newest): `step` for
    every row when given, else each row's `batch.birth_step`. Raises ValueError for a non-integer step."""
    if step is not None:
        step = _step_arg(step, "ReplayBuffer.add")
        return step, step
    b = _host(batch.birth_step)
    if b.shape != (len(batch),) or b.dtype.kind not in "iu":
        raise ValueError(
            f"{where}: birth_step has shape {b.shape} and dtype {b.dtype}; allowed: {len(batch)} integers"
        )
    lo, hi = int(b.min()), int(b.max())
    return (lo if lo == hi else b.astype(np.int64)), hi


def _prompt_keys(prompt_keys: Optional[Sequence[int]], n: int, where: str = "ReplayBuffer.add") -> np.ndarray:
    """(n,) int64 prompt keys (-1 each when None); raises ValueError for another length or non-integers."""
    if prompt_keys is None:
        return np.full(n, -1, np.int64)
    pk = np.asarray(prompt_keys.cpu() if isinstance(prompt_keys, torch.Tensor) else prompt_keys)
    if pk.shape != (n,) or pk.dtype.kind not in "iu":
        raise ValueError(
            f"{where}: prompt_keys has shape {pk.shape} and dtype {pk.dtype}; allowed: {n} integers, "
            f"one per row"
        )
    return pk.astype(np.int64)


def _group_index(group_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """((n,) int64 rank of each row's group id among the distinct ids (np.unique's inverse), the number of
    distinct ids), without a sort when the ids are already in order (rows of a group adjacent, as generation
    hands them over)."""
    g = group_ids.ravel()
    if len(g) and bool((g[1:] >= g[:-1]).all()):
        inv = np.empty(len(g), np.int64)
        inv[0] = 0
        np.cumsum(g[1:] != g[:-1], out=inv[1:])
        return inv, int(inv[-1]) + 1
    uniq, inv = np.unique(g, return_inverse=True)
    return inv.astype(np.int64).ravel(), len(uniq)
