"""`ReplayBuffer`: stores rollouts, evicts by age (and capacity), samples by priority.

Glue over three small parts, each with state_dict/load_state_dict: `RolloutStorage` (what is kept),
`AgeEviction`/`CapacityEviction` (what is dropped) and `PrioritizedSampler` (what is drawn). Advantages,
group statistics, behaviour log-probs and the sampling weight are frozen at insertion (METHOD.md).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from .config import ReplayConfig
from .eviction import AgeEviction, CapacityEviction
from .priority import PRIORITIES
from .rollout import RolloutBatch, check_token_ids
from .sampler import PrioritizedSampler
from .storage import RolloutStorage

STATE_VERSION = 1


class ReplayBuffer:
    def __init__(self, config: Optional[ReplayConfig] = None, seed: int = 0):
        self.config = config or ReplayConfig()
        self.rng = np.random.default_rng(seed)
        self.storage = RolloutStorage()
        self.age_eviction = AgeEviction(self.config.tau_max)
        self.capacity_eviction = CapacityEviction(self.config.capacity, whole_groups=self.config.granularity == "group")
        self.sampler = PrioritizedSampler(self.config.replacement, by_group=self.config.granularity == "group")
        self._priority = PRIORITIES.get(self.config.priority)
        self._next_group = 0
        self.total_added = 0
        self.total_evicted_age = 0
        self.total_evicted_capacity = 0

    def __len__(self) -> int:
        return len(self.storage)

    # --- Algorithm 1 step 7 -------------------------------------------------------------------------
    def add(self, batch: RolloutBatch, step: int, prompt_keys: Optional[Sequence[int]] = None) -> int:
        """Insert fresh rows generated at optimizer step `step` (birth step). Returns rows added.

        Rows are stored unpadded: prompt tokens where prompt_mask is 1, completion tokens up to the last
        counted one. Group ids are mapped to buffer-wide keys, so ids may repeat across calls.
        """
        n = len(batch)
        if n == 0:
            return 0
        if bool(batch.is_replay.any()):
            raise ValueError("ReplayBuffer.add: batch holds replay rows; insert only fresh rows")
        for name in ("completion_mask", "behaviour_logps") + (("ref_logps",) if batch.ref_logps is not None else ()):
            if getattr(batch, name).shape != batch.completion_ids.shape:
                raise ValueError(
                    f"ReplayBuffer.add: {name} has shape {tuple(getattr(batch, name).shape)}, "
                    f"completion_ids has {tuple(batch.completion_ids.shape)}; they must match"
                )
        check_token_ids(batch, "ReplayBuffer.add")
        adv = batch.advantages.detach().cpu().numpy().astype(np.float32)
        if not np.isfinite(adv).all():
            bad = np.flatnonzero(~np.isfinite(adv))[:5].tolist()
            raise ValueError(f"ReplayBuffer.add: advantages must be finite; rows {bad} are NaN or inf")
        std = batch.group_std.detach().cpu().numpy().astype(np.float32)
        if not np.isfinite(std).all():
            raise ValueError("ReplayBuffer.add: group_std must be finite")
        _, inv = np.unique(batch.group_ids.cpu().numpy(), return_inverse=True)
        group_key = self._next_group + inv.astype(np.int64)
        self._next_group += int(inv.max()) + 1
        pk = np.full(n, -1, np.int64) if prompt_keys is None else np.asarray(prompt_keys, dtype=np.int64)
        tokens = _unpad(batch)
        weight = self._priority(adv, std, self.config.alpha, self.config.eps)
        scalars = {
            "birth_step": np.full(n, step, np.int64),
            "advantage": adv,
            "reward": batch.rewards.detach().cpu().numpy().astype(np.float32),
            "group_std": std,
            "group_key": group_key,
            "prompt_key": pk,
            "weight": weight,
        }
        self.storage.add(scalars, tokens)
        self.total_added += n
        evict = self.capacity_eviction.select(self.storage)
        self.storage.remove(evict)
        self.total_evicted_capacity += len(evict)
        return n

    # --- Algorithm 1 steps 4-5 ----------------------------------------------------------------------
    def evict(self, step: int) -> int:
        """Drop every rollout with age > tau_max at `step`. Returns rows evicted."""
        slots = self.age_eviction.select(self.storage, step)
        self.storage.remove(slots)
        self.total_evicted_age += len(slots)
        return len(slots)

    def sample(self, n_rows: int, step: int) -> RolloutBatch:
        """Evict stale rows, then draw about n_rows replay rows (exactly min(n_rows, len) at rollout
        granularity). Empty during warm-up, when replay is off, or when the buffer is empty; sampling
        never removes a rollout."""
        self.evict(step)
        if step < self.config.warmup_steps or not self.config.enabled:
            n_rows = 0
        slots = self.sampler.sample(self.storage, n_rows, self.rng)
        return self.gather(slots)

    def gather(self, slots: np.ndarray) -> RolloutBatch:
        """Padded replay batch of the given slots (prompts left-padded, completions right-padded)."""
        st = self.storage
        n = len(slots)
        toks = [st.tokens(s) for s in slots.tolist()]
        plen = np.array([len(t[0]) for t in toks], dtype=np.int64)
        clen = np.array([len(t[1]) for t in toks], dtype=np.int64)
        P = int(plen.max()) if n else 0
        C = int(clen.max()) if n else 0
        # Scatter the concatenated rows into padded arrays with one boolean-mask assignment per field:
        # row-major mask order equals the concatenation order.
        pmask = np.arange(P)[None, :] >= (P - plen)[:, None]  # (n, P) left-padded
        cmask = np.arange(C)[None, :] < clen[:, None]  # (n, C) right-padded

        def pad(mask, k, dtype):
            out = np.zeros(mask.shape, dtype)
            if n:
                out[mask] = np.concatenate([t[k] for t in toks])
            return torch.from_numpy(out)

        has_ref = n > 0 and toks[0][4] is not None
        col = lambda k: torch.from_numpy(st.col(k)[slots].copy())  # noqa: E731
        return RolloutBatch(
            prompt_ids=pad(pmask, 0, np.int64),
            prompt_mask=torch.from_numpy(pmask.astype(np.int64)),
            completion_ids=pad(cmask, 1, np.int64),
            completion_mask=pad(cmask, 3, np.int64),
            behaviour_logps=pad(cmask, 2, np.float32),
            advantages=col("advantage"),
            rewards=col("reward"),
            group_ids=col("group_key"),
            group_std=col("group_std"),
            birth_step=col("birth_step"),
            is_replay=torch.ones(n, dtype=torch.bool),
            ref_logps=pad(cmask, 4, np.float32) if has_ref else None,
        )

    def prompt_keys(self, slots: np.ndarray) -> np.ndarray:
        return self.storage.col("prompt_key")[slots]

    # --- diagnostics --------------------------------------------------------------------------------
    def stats(self, step: int) -> dict[str, Any]:
        slots = self.storage.valid_slots()
        ages = step - self.storage.col("birth_step")[slots]
        return {
            "buffer/size": len(self),
            "buffer/mean_age": float(ages.mean()) if len(ages) else 0.0,
            "buffer/max_age": int(ages.max()) if len(ages) else 0,
            "buffer/age_hist": np.bincount(ages.clip(min=0)).tolist() if len(ages) else [],
            "buffer/bytes": self.storage.nbytes(),
            "buffer/evicted_age": self.total_evicted_age,
            "buffer/evicted_capacity": self.total_evicted_capacity,
        }

    # --- persistence ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "config": self.config.to_dict(),
            "rng": self.rng.bit_generator.state,
            "next_group": self._next_group,
            "totals": [self.total_added, self.total_evicted_age, self.total_evicted_capacity],
            "storage": self.storage.state_dict(),
            "sampler": self.sampler.state_dict(),
            "age_eviction": self.age_eviction.state_dict(),
            "capacity_eviction": self.capacity_eviction.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"replay buffer state version {state.get('version')!r}; expected {STATE_VERSION}")
        if state["config"] != self.config.to_dict():
            raise ValueError(
                f"replay buffer state was saved with config {state['config']}, this buffer has {self.config.to_dict()}"
            )
        self.rng.bit_generator.state = state["rng"]
        self._next_group = int(state["next_group"])
        self.total_added, self.total_evicted_age, self.total_evicted_capacity = (int(x) for x in state["totals"])
        self.storage.load_state_dict(state["storage"])
        self.sampler.load_state_dict(state["sampler"])
        self.age_eviction.load_state_dict(state["age_eviction"])
        self.capacity_eviction.load_state_dict(state["capacity_eviction"])

    def save(self, path: str | os.PathLike) -> None:
        """Write `<path>.npz` (arrays, allow_pickle=False) and `<path>.json` (everything else), atomically."""
        path = Path(path)
        state = self.state_dict()
        storage = state.pop("storage")
        arrays = {k: v for k, v in storage.items() if isinstance(v, np.ndarray)}
        state["storage_scalars"] = {k: _plain(v) for k, v in storage.items() if not isinstance(v, np.ndarray)}
        _atomic_write(path.with_suffix(".npz"), lambda f: np.savez(f, **arrays))
        _atomic_write(path.with_suffix(".json"), lambda f: f.write(json.dumps(state).encode()))

    @classmethod
    def load(cls, path: str | os.PathLike, config: Optional[ReplayConfig] = None) -> "ReplayBuffer":
        path = Path(path)
        state = json.loads(path.with_suffix(".json").read_text())
        config = config or ReplayConfig(**state["config"])
        with np.load(path.with_suffix(".npz"), allow_pickle=False) as z:
            storage = {k: z[k] for k in z.files}
        storage.update(state.pop("storage_scalars"))
        state["storage"] = storage
        buf = cls(config)
        buf.load_state_dict(state)
        return buf


def _unpad(batch: RolloutBatch) -> list[tuple]:
    """Per row (prompt ids int32, completion ids int32, behaviour log-probs float32, completion mask bool,
    ref log-probs float32 or None), unpadded. Vectorised: one boolean-mask gather
    per field, then split (the rows are views into one array per call)."""
    pmask = batch.prompt_mask.cpu().numpy().astype(bool)
    cm = batch.completion_mask.cpu().numpy().astype(bool)
    C = cm.shape[1]
    # completion length = last counted position + 1 (a mask may have interior zeros, e.g. tool output)
    clen = np.where(cm.any(1), C - np.argmax(cm[:, ::-1], axis=1), 0)
    keep = np.arange(C)[None, :] < clen[:, None]
    plen = pmask.sum(1)
    pb, cb = _bounds(plen), _bounds(clen)
    prompts = _split(batch.prompt_ids.cpu().numpy()[pmask].astype(np.int32), pb)
    comps = _split(batch.completion_ids.cpu().numpy()[keep].astype(np.int32), cb)
    logps = _split(batch.behaviour_logps.detach().cpu().float().numpy()[keep], cb)
    masks = _split(cm[keep], cb)
    refs = (
        _split(batch.ref_logps.detach().cpu().float().numpy()[keep], cb)
        if batch.ref_logps is not None
        else [None] * len(clen)
    )
    return list(zip(prompts, comps, logps, masks, refs))


def _bounds(lengths: np.ndarray) -> list[tuple[int, int]]:
    ends = np.cumsum(lengths).tolist()
    return list(zip([0] + ends[:-1], ends))


def _split(flat: np.ndarray, bounds: list[tuple[int, int]]) -> list[np.ndarray]:
    return [flat[a:b] for a, b in bounds]  # views; cheaper than np.split for many small rows


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
