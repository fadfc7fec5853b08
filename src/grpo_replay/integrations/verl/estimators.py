"""Which of verl's advantage estimators (`algorithm.adv_estimator`, verl's `ADV_ESTIMATOR_REGISTRY`) replay runs
with: those that give one advantage per rollout, which a stored row keeps (frozen, with its |A_i| priority).

- OUTCOME: one advantage per rollout, constant over its response tokens; replayed as verl computed it when the row
  was fresh. Each is tested through the v1 trainer's real `fit()`.
- TOKEN_LEVEL: advantages from token-level returns or values (a critic, discounting, per-token baselines): a
  rollout has no one A_i to store; refused by name at launch.
- NOT_IN_V1: gdpo reads per-dimension reward components that verl 0.9.1's v1 `_compute_advantage` does not fetch
  (it selects uid, masks, scores and log-probs only), so it cannot run there with or without replay.
A name verl registers that is in none of them (a user's own estimator) is accepted; the first update refuses it
if its advantages vary over a row's response tokens (`adapter_rows.row_advantages` in the core).
"""
from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

OUTCOME = ("grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "reinforce_plus_plus_baseline", "grpo_passk",
           "opo", "gpg")
TOKEN_LEVEL = ("gae", "reinforce_plus_plus", "remax", "optimal_token_baseline", "tir_optimal_token_baseline")
NOT_IN_V1 = ("gdpo",)
FIELD = "algorithm.adv_estimator"


def check_estimator(config: Any, v1: bool = True) -> None:
    """ValueError naming `algorithm.adv_estimator` when replay cannot store its advantages (TOKEN_LEVEL), or, on
    the v1 trainer, when verl's v1 trainer cannot run it (NOT_IN_V1)."""
    name = OmegaConf.select(config, FIELD) if OmegaConf.is_config(config) else None
    name = getattr(name, "value", name)  # verl's AdvantageEstimator enum
    allowed = f"allowed: an outcome estimator ({', '.join(OUTCOME)})"
    if name in TOKEN_LEVEL:
        raise ValueError(
            f"{FIELD}={name!r}: replay stores one advantage per rollout, and {name} computes token-level "
            f"advantages (returns, values or per-token baselines); {allowed}, or plain verl for {name}")
    if v1 and name in NOT_IN_V1:
        raise ValueError(
            f"{FIELD}={name!r}: verl's v1 trainer does not hand {name} the per-dimension reward components it reads "
            f"(its _compute_advantage fetches no reward_extra_info), so it fails there with or without replay; "
            f"{allowed}, or trainer.use_v1=false")
