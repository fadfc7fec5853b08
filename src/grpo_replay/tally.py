"""`Tally`: one update's replay metrics as sums, counts and maxima, turned into `metric_names`' vocabulary once.

Every trainer logs the same names from the same arithmetic: each process tallies its own rows, a backend with
several processes all-reduces the tallies (sums added, maxima taken: `Tally.merge`), and `metrics()` divides. The
means divide in float32, as `torch.mean` of a float32 tensor does, so a one-process tally reads exactly as the
mean over the rows would.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

import torch

from . import metric_names as mn
from .rollout import RolloutBatch

KINDS = ("fresh", "replay")
# Each group of keys is measured together (all present or none), so every process of a run sends the same keys;
# the keys of MAXES are merged by their maximum, all others summed.
ROW_KEYS = tuple(f"{k}/{x}" for k in KINDS for x in ("rows", "abs_adv")) + ("replay/age", "replay/age_max")
REWARD_KEYS = tuple(f"{k}/reward" for k in KINDS)
CLIP_KEYS = tuple(f"{k}/{x}" for k in KINDS for x in ("tokens", "ratio", "clipped", "ratio_max"))
GROUP_KEYS = ("groups", "zero_variance_groups")
DRIFT_KEYS = ("replay/dropped", "replay/drift", "replay/drift_rows", "replay/drift_max")
MAXES = ("replay/age_max", "fresh/ratio_max", "replay/ratio_max", "replay/drift_max")
# kind -> the metric names of its rows: (count, mean |A|, mean reward, ratio mean, ratio max, clip fraction)
NAMES = {"fresh": (mn.FRESH_COUNT, mn.FRESH_ABS_ADV, mn.FRESH_REWARD, mn.FRESH_RATIO_MEAN, mn.FRESH_RATIO_MAX,
                   mn.FRESH_CLIP_FRAC),
         "replay": (mn.REPLAY_COUNT, mn.REPLAY_ABS_ADV, mn.REPLAY_REWARD, mn.REPLAY_RATIO_MEAN, mn.REPLAY_RATIO_MAX,
                    mn.REPLAY_CLIP_FRAC)}


class Tally(dict):
    """str -> float: sums under their own keys (not metric names: `metrics()` names them), the key groups measured (`ROW_KEYS`, `REWARD_KEYS`, `CLIP_KEYS`, `GROUP_KEYS`, `DRIFT_KEYS`), plus
    `replay/age_hist` (one process's ages; not merged). A metric whose rows or tokens count is 0 is left out."""

    @classmethod
    def of(cls, batch: RolloutBatch, step: int, *, groups: Optional[int] = None,
           zero_variance_groups: Optional[int] = None, drift: Optional[torch.Tensor] = None,
           dropped: Optional[torch.Tensor] = None) -> "Tally":
        """Rows, |A|, rewards and ages (at `step`) of an update batch by kind; `groups` generated this step of
        which `zero_variance_groups` had no reward variance (the unit is the caller's: rows of whole groups
        give the same share); `dropped` (B,) bool and `drift` (B,) per row under max_drift. The row entries count
        the rows that reached the loss (`dropped` ones left out); the drift entries every replayed row."""
        kept = slice(None) if dropped is None else ~dropped.cpu()
        t = cls.of_values(batch.is_replay.cpu()[kept], batch.advantages.cpu()[kept], batch.rewards.cpu()[kept],
                          batch.age(step).cpu()[kept])
        if groups is not None:
            t["groups"] = float(groups)
            t["zero_variance_groups"] = float(zero_variance_groups or 0)
        if dropped is not None:
            t.update(cls.of_drift(batch, drift, dropped))
        return t

    @classmethod
    def of_values(cls, is_replay: torch.Tensor, advantages: torch.Tensor, rewards: Optional[torch.Tensor],
                  ages: torch.Tensor) -> "Tally":
        """`of` from the per-row values themselves ((B,) each; ages of the replayed rows in the engine's unit),
        for an engine whose rows are not a `RolloutBatch`; rewards None: not tallied."""
        t = cls(_empty(ROW_KEYS + (REWARD_KEYS if rewards is not None else ())))
        rep = is_replay.cpu()
        for kind, rows in zip(KINDS, (~rep, rep)):
            k = int(rows.sum())
            t[f"{kind}/rows"] = float(k)
            if k:
                t[f"{kind}/abs_adv"] = float(advantages.cpu()[rows].abs().sum())
                if rewards is not None:
                    t[f"{kind}/reward"] = float(rewards.cpu()[rows].float().sum())
        if bool(rep.any()):
            a = ages.cpu()[rep]
            t["replay/age"] = float(a.float().sum())
            t["replay/age_max"] = float(a.max())
            t["replay/age_hist"] = torch.bincount(a.clamp(min=0)).tolist()
        return t

    @classmethod
    def of_drift(cls, batch: RolloutBatch, drift: Optional[torch.Tensor], dropped: torch.Tensor) -> "Tally":
        """The drift bound's keys: rows `dropped` ((B,) bool), and the drift ((B,), None when not measured) of
        the replayed rows of `batch`."""
        rep = batch.is_replay.cpu()
        return cls.of_drift_values(None if drift is None else drift.detach().cpu()[rep], dropped)

    @classmethod
    def of_drift_values(cls, drift: Optional[torch.Tensor], dropped: torch.Tensor) -> "Tally":
        """`of_drift` from the replayed rows' drift ((R,), None when not measured) and the rows dropped."""
        t = cls(_empty(DRIFT_KEYS))
        t["replay/dropped"] = float(dropped.cpu().sum())
        if drift is not None and len(drift):
            d = drift.detach().cpu()
            t["replay/drift"], t["replay/drift_rows"] = float(d.sum()), float(len(d))
            t["replay/drift_max"] = float(d.max())
        return t

    def add_clip(self, kind: str, ratio: torch.Tensor, clipped: torch.Tensor, mask: torch.Tensor) -> None:
        """PPO-clip statistics of one kind's counted tokens: ratio sum and max, clipped tokens, tokens (summed
        over calls: micro-batches)."""
        for k, v in _empty(CLIP_KEYS).items():
            self.setdefault(k, v)
        m = mask.bool()
        r, c = ratio[m].detach().float().cpu(), clipped[m].cpu()
        if not r.numel():
            return
        self[f"{kind}/tokens"] += float(r.numel())
        self[f"{kind}/ratio"] += float(r.sum())
        self[f"{kind}/clipped"] += float(c.float().sum())
        self[f"{kind}/ratio_max"] = max(self[f"{kind}/ratio_max"], float(r.max()))

    def flat(self) -> dict[str, float]:
        """The mergeable entries (the age histogram left out): the same keys on every process of a run."""
        return {k: v for k, v in self.items() if k != mn.REPLAY_AGE_HIST}

    @classmethod
    def merge(cls, per_process: Mapping[str, Iterable[float]]) -> "Tally":
        """key -> every process's value (a gathered tensor or a list): sums added, maxima taken."""
        t = cls()
        for k, vals in per_process.items():
            vals = [float(v) for v in vals]
            t[k] = max(vals) if k in MAXES else sum(vals)
        return t

    def metrics(self) -> dict[str, Any]:
        """The metrics row's replay entries under `metric_names`' names."""
        out: dict[str, Any] = {}
        fresh, replay = int(self.get("fresh/rows", 0)), int(self.get("replay/rows", 0))
        rows = "fresh/rows" in self  # a tally of rows, not only of a loss's tokens (`add_clip`)
        if rows:
            out[mn.REPLAY_SHARE] = _div(replay, fresh + replay) if fresh + replay else 0.0
        for kind, n in zip(KINDS, (fresh, replay)):
            count, abs_adv, reward, ratio_mean, ratio_max, clip_frac = NAMES[kind]
            if rows:
                out[count] = n
            if rows and not n:
                # No rows of this kind (replay before its warm-up): a ratio of 1.0 or an age of 0 written here would be
                # averaged into every curve as if replay had been on-policy; the count alone says it.
                continue
            for name, total in ((abs_adv, f"{kind}/abs_adv"), (reward, f"{kind}/reward")):
                if total in self:
                    out[name] = _div(self[total], n)
            tokens = self.get(f"{kind}/tokens", 0.0)
            if tokens:
                out[ratio_mean] = _div(self[f"{kind}/ratio"], tokens)
                out[ratio_max] = self[f"{kind}/ratio_max"]
                out[clip_frac] = _div(self[f"{kind}/clipped"], tokens)
        if replay and "replay/age" in self:
            out[mn.REPLAY_AGE_MEAN] = _div(self["replay/age"], replay)
            out[mn.REPLAY_AGE_MAX] = int(self["replay/age_max"])
            if "replay/age_hist" in self:
                out[mn.REPLAY_AGE_HIST] = self["replay/age_hist"]
        if self.get("groups"):
            out[mn.ZERO_VARIANCE_SHARE] = 1.0 - _div(self["groups"] - self["zero_variance_groups"], self["groups"])
        if "replay/dropped" in self:
            out[mn.REPLAY_DRIFT_DROPPED] = int(self["replay/dropped"])
        if self.get("replay/drift_rows"):
            out[mn.REPLAY_DRIFT_MEAN] = _div(self["replay/drift"], self["replay/drift_rows"])
            out[mn.REPLAY_DRIFT_MAX] = self["replay/drift_max"]
        return out


def _empty(keys: tuple[str, ...]) -> dict[str, float]:
    return {k: (float("-inf") if k in MAXES else 0.0) for k in keys}


def _div(num: float, den: float) -> float:
    """num / den in float32, as `torch.mean` divides a float32 sum (so a tally of one process reads as the mean)."""
    return float(torch.tensor(num, dtype=torch.float32) / den)
