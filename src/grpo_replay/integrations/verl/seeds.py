"""One run per seed: a launch that changes only `replay.seed` is refused before Ray starts.

`replay.seed` seeds only the buffer's draws. verl's own seeds (the prompt order `data.seed`, vLLM's sampling
`actor_rollout_ref.rollout.seed`, the update's shuffle `actor.data_loader_seed`, the actor's FSDP seed) do not
follow it, so a seed loop over `replay.seed` alone trains the GRPO arm (no replay) exactly as seed 0 does, and the
replay arms differ from seed 0 only in which stored rows they draw: the "seeds" are one run.
"""
from __future__ import annotations

import functools
import os
from typing import Any

from .v1_checks import _get

VERL_SEEDS = ("data.seed", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.actor.data_loader_seed",
              "actor_rollout_ref.actor.fsdp_config.seed")


@functools.lru_cache(maxsize=1)
def verl_defaults() -> dict[str, Any]:
    """verl's own default for each of `VERL_SEEDS` (its ppo_trainer config, read from the installed verl)."""
    import verl
    from omegaconf import OmegaConf

    path = os.path.join(os.path.dirname(verl.__file__), "trainer", "config", "_generated_ppo_trainer.yaml")
    config = OmegaConf.load(path)
    return {key: OmegaConf.select(config, key) for key in VERL_SEEDS}


def check_seeds(config: Any) -> None:
    """ValueError when `replay.seed` is not 0 while every verl seed is seed 0's: 0 (the launchers' SEED=0) or
    verl's default."""
    seed = _get(config, "replay.seed", 0)
    if seed in (None, 0):
        return
    defaults = verl_defaults()
    values = {key: _get(config, key) for key in VERL_SEEDS}
    if all(v in (0, defaults[key]) for key, v in values.items()):
        now = ", ".join(f"{k}={v}" for k, v in values.items())
        raise ValueError(
            f"data.seed={values['data.seed']}: the launch sets replay.seed={seed} but verl's seeds are seed 0's "
            f"({now}), so the GRPO arm repeats seed 0's run and the replay arms differ only in their draws; "
            f"allowed: every seed set with it: SEED={seed} for the launchers (examples/verl), or "
            + " ".join(f"{k}={seed}" for k in VERL_SEEDS))
