"""How many rows a composed verl update may have, for both trainers.

verl's worker splits the update batch over the DP ranks, each rank's share into K PPO mini-batches and, with
static micro-batches, each mini-batch into `ppo_micro_batch_size_per_gpu` rows (`prepare_micro_batches`
asserts). So the composed batch (fresh + replay) is fitted to a multiple of a unit that every one of those
divisions accepts (by the core's step plan, through `ReplaySession.compose`); the trainer then scales the
mini-batch to total / K rows so K, the optimizer steps per epoch of the fresh batch, is unchanged
(`scaled_mini_batch`, the one rule both trainers log and apply, `mini_batch_scaled` the scope they apply it in).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any

from omegaconf import OmegaConf, open_dict


def verl_mini_batch(config: Any) -> tuple[int, int, int]:
    """(verl's PPO mini-batch in rows, `actor.ppo_mini_batch_size * rollout.n`; rollout.n; `micro_batch_rows`)
    of a verl trainer config: what `batch_unit` takes."""
    actor_cfg = config.actor_rollout_ref.actor
    n = int(config.actor_rollout_ref.rollout.n)
    return int(actor_cfg.ppo_mini_batch_size) * n, n, micro_batch_rows(actor_cfg)


def micro_batch_rows(actor_cfg: Any) -> int:
    """Rows per micro-batch verl's worker asserts on: `ppo_micro_batch_size_per_gpu` with static micro-batches,
    1 with `use_dynamic_bsz` (token-budgeted micro-batches divide any share)."""
    if actor_cfg.get("use_dynamic_bsz", False):
        return 1
    return int(actor_cfg.get("ppo_micro_batch_size_per_gpu") or 1)


def batch_unit(
    n_rows: int, mini_batch_rows: int, dp: int, micro: int, group_size: int, keep_optimizer_steps: bool
) -> tuple[int, int]:
    """(K, unit) for a fresh batch of `n_rows` rows and verl's PPO mini-batch of `mini_batch_rows`
    (`ppo_mini_batch_size * rollout.n`): K optimizer steps per epoch without replay, and the row count the composed
    batch must be a multiple of. With `keep_optimizer_steps` a scaled mini-batch must stay a multiple of
    `group_size` (rollout.n, to be expressible as `ppo_mini_batch_size * rollout.n`) and of dp * micro, so the unit
    is K * lcm(group_size, dp * micro); otherwise verl's mini-batch is kept and is the unit. ValueError when
    verl's batch sizes cannot be kept."""
    mb = mini_batch_rows
    if n_rows % mb:
        raise ValueError(f"fresh batch of {n_rows} rows is not a multiple of the PPO mini-batch ({mb} rows)")
    k = n_rows // mb
    if keep_optimizer_steps:
        base = math.lcm(group_size, dp * micro)
        if mb % base:
            raise ValueError(
                f"PPO mini-batch of {mb} rows (ppo_mini_batch_size * rollout.n) must divide by rollout.n "
                f"({group_size}) and DP size * ppo_micro_batch_size_per_gpu ({dp} * {micro}); lcm {base}"
            )
        return k, k * base
    if mb % (dp * micro):
        raise ValueError(
            f"PPO mini-batch of {mb} rows must divide by DP size * ppo_micro_batch_size_per_gpu ({dp} * {micro})"
        )
    return k, mb


def scaled_mini_batch(total: int, k_steps: int, mini_batch_rows: int, keep_optimizer_steps: bool) -> tuple[int, int]:
    """(rows per PPO mini-batch, optimizer steps per epoch) of a composed update of `total` rows, for `batch_unit`'s
    (K, unit) and verl's mini-batch of `mini_batch_rows`: with `keep_optimizer_steps` total / K rows, K steps (the
    total is a multiple of the unit, so of K); otherwise verl's mini-batch, total / mini_batch_rows steps."""
    if keep_optimizer_steps:
        return total // k_steps, k_steps
    return mini_batch_rows, total // mini_batch_rows


@contextlib.contextmanager
def mini_batch_scaled(config: Any, mini_batch_rows: int):
    """Within the block, verl's `actor.ppo_mini_batch_size` (prompts; verl multiplies it by rollout.n) is
    `mini_batch_rows / rollout.n` (`scaled_mini_batch`'s rows): the trainers' `_update_actor` reads it when it
    builds the worker's mini-batch, so the composed batch gives the fresh batch's K optimizer steps. Restored
    afterwards, also on an error."""
    actor_cfg = config.actor_rollout_ref.actor
    ppo_mini_batch_size = mini_batch_rows // int(config.actor_rollout_ref.rollout.n)
    key = "ppo_mini_batch_size"
    old = actor_cfg[key]
    writable = open_dict if OmegaConf.is_config(actor_cfg) else lambda _: contextlib.nullcontext()
    try:
        with writable(actor_cfg):
            actor_cfg[key] = ppo_mini_batch_size
        yield
    finally:
        with writable(actor_cfg):
            actor_cfg[key] = old
