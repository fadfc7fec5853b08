"""Group-relative advantages and the zero-variance group filter (docs/method.md, Algorithm 1 steps 2-3)."""
from __future__ import annotations

import torch

SCALES = ("group", "none")


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale: str = "group", eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """A_i = (r_i - mean_g) / (std_g + eps) per group (scale="group"), or r_i - mean_g (scale="none", Dr.GRPO).

    rewards: (B,) float; group_ids: (B,) long, rows of a group share an id (any order, any group sizes).
    Returns (advantages (B,) float32, group_std (B,) float32: the std of each row's group, broadcast).
    std is the sample std (n-1), as TRL and verl compute it; a group of one has std 0.
    A NaN/inf reward raises ValueError naming the rows: it would make its whole group's advantages NaN.
    """
    if scale not in SCALES:
        raise ValueError(f"advantage scale {scale!r} is invalid; allowed: {', '.join(SCALES)}")
    _check_rewards("group_advantages", rewards, group_ids)
    r = rewards.double()
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    G = counts.numel()
    sums = torch.zeros(G, dtype=torch.float64).index_add_(0, inv, r)  # (G,)
    mean = sums / counts  # (G,)
    dev = r - mean[inv]  # (B,)
    sq = torch.zeros(G, dtype=torch.float64).index_add_(0, inv, dev * dev)  # (G,)
    std = torch.where(counts > 1, (sq / (counts - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))  # (G,)
    row_std = std[inv]  # (B,)
    # An all-equal group has dev == 0; keep A = 0 there even with eps = 0 (0/0 would be NaN).
    adv = torch.where(dev == 0, torch.zeros_like(dev), dev / (row_std + eps)) if scale == "group" else dev
    return adv.float(), row_std.float()


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
