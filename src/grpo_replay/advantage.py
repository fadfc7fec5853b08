"""Advantage estimators by name and the zero-variance group filter (docs/method.md, Algorithm 1 steps 2-3).

Every estimator gives one advantage per rollout from the rewards of a generation batch and the rows' groups. One
signature: (rewards (B,), group_ids (B,), eps) -> advantages (B,) float32. The batch-level ones (grpo_batch,
reinforce_plus_plus_baseline) read the whole batch passed in: the trainer passes one generation round, every
group of it, before the zero-variance filter. A row keeps the advantage its generation's estimator gave it: the
buffer stores that value and its priority derives from it.
"""
from __future__ import annotations

from typing import Callable

import torch

from .registry import Registry

SCALES = ("group", "batch", "none")
"""TRL's `scale_rewards`: what GRPO's group-centred reward is divided by (the group std, the batch std, nothing)."""

EstimatorFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
ESTIMATORS: Registry[EstimatorFn] = Registry("advantage estimator", params=("rewards", "group_ids", "eps"))

_SCALE_ESTIMATOR = {"group": "grpo", "batch": "grpo_batch", "none": "dr_grpo"}


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale: str = "group", eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """A_i = (r_i - mean_g) / (std_g + eps) per group (scale="group"), (r_i - mean_g) / (std_batch + eps)
    (scale="batch", TRL's scale_rewards="batch"), or r_i - mean_g (scale="none", Dr.GRPO).

    rewards: (B,) float; group_ids: (B,) long, rows of a group share an id (any order, any group sizes).
    Returns (advantages (B,) float32, group_std (B,) float32: the std of each row's group, broadcast).
    std is the sample std (n-1), as TRL and verl compute it; a group of one has std 0.
    A NaN/inf reward raises ValueError naming the rows: it would make its whole group's advantages NaN.
    """
    if scale not in SCALES:
        raise ValueError(f"advantage scale {scale!r} is invalid; allowed: {', '.join(SCALES)}")
    return estimate(_SCALE_ESTIMATOR[scale], rewards, group_ids, eps)


def estimate(
    name: str, rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages (B,) float32 by the estimator `name` of `ESTIMATORS`, group_std (B,) float32).

    group_std is each row's group's sample std whatever the estimator (the group_std priority and the
    diagnostics read it). Raises ValueError on an unknown name or a NaN/inf reward."""
    fn = ESTIMATORS.get(name)
    _check_rewards(f"advantages ({name})", rewards, group_ids)
    adv = fn(rewards, group_ids, eps)
    return adv.float(), _group_stats(rewards.double(), group_ids)[2].float()


def _group_stats(r: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row (B,) float64: (deviation from its group mean r_i - mean_g, its group's mean, its group's sample
    std (0 for a group of one), its group's size)."""
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    G = counts.numel()
    mean = torch.zeros(G, dtype=torch.float64).index_add_(0, inv, r) / counts  # (G,)
    dev = r - mean[inv]  # (B,)
    sq = torch.zeros(G, dtype=torch.float64).index_add_(0, inv, dev * dev)  # (G,)
    std = torch.where(counts > 1, (sq / (counts - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))  # (G,)
    return dev, mean[inv], std[inv], counts[inv].double()


def _divide(dev: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """dev / (scale + eps), keeping A = 0 where dev == 0 even with eps = 0 (0/0 would be NaN)."""
    return torch.where(dev == 0, torch.zeros_like(dev), dev / (scale + eps))


def _batch_std(x: torch.Tensor) -> torch.Tensor:
    """The sample std (n-1) of the whole batch (0 for one row), as a 0-dim float64 tensor."""
    return x.std() if x.numel() > 1 else torch.zeros((), dtype=torch.float64)


@ESTIMATORS.register("grpo")
def grpo(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """GRPO: (r_i - mean_g) / (std_g + eps), the std of the row's own group."""
    dev, _, std, _ = _group_stats(rewards.double(), group_ids)
    return _divide(dev, std, eps)


@ESTIMATORS.register("dr_grpo")
def dr_grpo(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """Dr. GRPO: r_i - mean_g, unscaled (eps unused)."""
    return _group_stats(rewards.double(), group_ids)[0]


@ESTIMATORS.register("grpo_batch")
def grpo_batch(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """TRL's scale_rewards="batch": (r_i - mean_g) / (std(r over the batch) + eps), one scale for every row."""
    r = rewards.double()
    return _divide(_group_stats(r, group_ids)[0], _batch_std(r), eps)


@ESTIMATORS.register("rloo")
def rloo(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """RLOO: r_i minus the mean of the other rollouts of its group, = n / (n - 1) * (r_i - mean_g); 0 for a group
    of one (no other rollout to compare with). Unscaled (eps unused)."""
    dev, _, _, n = _group_stats(rewards.double(), group_ids)
    return torch.where(n > 1, dev * n / (n - 1).clamp(min=1), torch.zeros_like(dev))


@ESTIMATORS.register("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """REINFORCE++ with a group baseline: d_i = r_i - mean_g, then whitened over the batch,
    (d_i - mean(d)) / (std(d) + eps), every rollout weighing one (verl weighs each by its response tokens).
    With whole groups mean(d) = 0, so a zero-variance group keeps A = 0."""
    dev = _group_stats(rewards.double(), group_ids)[0]
    centred = dev - dev.mean() if dev.numel() else dev
    return _divide(centred, _batch_std(dev), eps)


def nonzero_variance_mask(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) bool: True for rows whose group's rewards are not all equal.

    Raises ValueError on a NaN/inf reward (NaN != NaN would keep its group), like `group_advantages`.
    Exact comparison (max != min) rather than std > tol: with binary rewards any tolerance is arbitrary,
    and an all-equal group has every A_i = 0, contributing nothing but noise to the normaliser.
    """
    _check_rewards("nonzero_variance_mask", rewards, group_ids)
    _, inv = torch.unique(group_ids, return_inverse=True)
    G = int(inv.max()) + 1 if inv.numel() else 0
    r = rewards.double()
    mx = torch.full((G,), -float("inf"), dtype=torch.float64).scatter_reduce(0, inv, r, "amax")
    mn = torch.full((G,), float("inf"), dtype=torch.float64).scatter_reduce(0, inv, r, "amin")
    return (mx != mn)[inv]


def _check_rewards(fn: str, rewards: torch.Tensor, group_ids: torch.Tensor) -> None:
    """Shapes and finiteness, with an error that says what to pass instead of a torch indexing error."""
    if not isinstance(rewards, torch.Tensor) or not isinstance(group_ids, torch.Tensor):
        raise ValueError(f"{fn}: rewards and group_ids must be torch tensors")
    if rewards.dim() != 1 or group_ids.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"{fn}: rewards and group_ids must be 1-D of the same length (one entry per rollout); "
            f"got rewards {tuple(rewards.shape)}, group_ids {tuple(group_ids.shape)}"
        )
    if rewards.is_complex() or not (rewards.is_floating_point() or rewards.dtype in _INT_DTYPES):
        raise ValueError(f"{fn}: rewards must be real numbers; got dtype {rewards.dtype}")
    if group_ids.dtype not in _INT_DTYPES:
        raise ValueError(f"{fn}: group_ids must be an integer tensor; got dtype {group_ids.dtype}")
    bad = ~torch.isfinite(rewards.double())
    if bool(bad.any()):
        rows = bad.nonzero().flatten()[:5].tolist()
        raise ValueError(
            f"{fn}: rewards must be finite; {int(bad.sum())} are NaN or inf (rows {rows}). "
            "Score a failed reward (e.g. 0) or drop its group before computing advantages."
        )


_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)
