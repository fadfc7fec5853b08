"""The replay metrics' names, one set for every trainer (built-in, TRL, verl): docs/metrics.md is their table.

A name carries its unit where two backends count in different units: ages are in steps (optimizer steps of the
trainer) except verl v1's, which are in policy versions (`REPLAY_AGE_VERSIONS_*`). Counts are rows of the update
batch; `BUFFER_EVICTED_*` are totals since the run began.

Runs recorded before the names were one set used a backend's own spelling; `canonical` renames an old row's keys
on read (`LEGACY`), so plots, compare and the reports read any run by these names.
"""
from __future__ import annotations

from typing import Any, Mapping

REPLAY_SHARE = "replay/share"  # replayed rows / update rows
FRESH_COUNT = "fresh/count"  # fresh rows in the update
REPLAY_COUNT = "replay/count"  # replayed rows in the update
FRESH_ABS_ADV = "fresh/abs_adv"  # mean |A| of the update's fresh rows
REPLAY_ABS_ADV = "replay/abs_adv"  # mean |A| of the update's replayed rows
FRESH_REWARD = "fresh/reward"  # mean reward of the update's fresh rows
REPLAY_REWARD = "replay/reward"
FRESH_RATIO_MEAN = "fresh/ratio_mean"  # importance ratio over the update's fresh tokens, mean
REPLAY_RATIO_MEAN = "replay/ratio_mean"
FRESH_RATIO_MAX = "fresh/ratio_max"
REPLAY_RATIO_MAX = "replay/ratio_max"
FRESH_CLIP_FRAC = "fresh/clip_frac"  # share of the fresh tokens the PPO clip cut
REPLAY_CLIP_FRAC = "replay/clip_frac"
REPLAY_AGE_MEAN = "replay/age_mean"  # steps since a replayed row was generated, mean over the replayed rows
REPLAY_AGE_MAX = "replay/age_max"
REPLAY_AGE_HIST = "replay/age_hist"
REPLAY_AGE_VERSIONS_MEAN = "replay/age_versions_mean"  # the same age in policy versions (verl v1)
REPLAY_AGE_VERSIONS_MAX = "replay/age_versions_max"
REPLAY_AGE_VERSIONS_MIN = "replay/age_versions_min"
REPLAY_INSERTED = "replay/inserted"  # rows inserted into the buffer this step
# share of the step's generated groups without reward variance (every trainer: a share, never a count of rows)
ZERO_VARIANCE_SHARE = "frac_zero_var_groups"
REPLAY_DRIFT_DROPPED = "replay/drift_dropped"  # replayed rows above max_drift: left out of the loss and evicted
REPLAY_DRIFT_MEAN = "replay/drift_mean"  # drift (loss.replay_drift) of the update's replayed rows, mean
REPLAY_DRIFT_MAX = "replay/drift_max"
BUFFER_SIZE = "buffer/size"  # rows held after the step
BUFFER_MEAN_AGE = "buffer/mean_age"  # ages of the rows held, in steps after the step
BUFFER_MAX_AGE = "buffer/max_age"
BUFFER_AGE_HIST = "buffer/age_hist"
BUFFER_BYTES = "buffer/bytes"  # bytes the storage holds
BUFFER_EVICTED_AGE = "buffer/evicted_age"  # rows evicted for age (tau_max), total
BUFFER_EVICTED_CAPACITY = "buffer/evicted_capacity"
BUFFER_EVICTED_USES = "buffer/evicted_uses"
BUFFER_EVICTED_DRIFT = "buffer/evicted_drift"
# one reward function's mean over the step's generated rollouts, with TrainConfig.reward_funcs set (TRL's own name)
REWARD_FUNC_MEAN = "rewards/{name}/mean"
# fresh rows left out of this step's buffer insert for a NaN or inf log-prob at a counted token (logged when > 0)
BUFFER_SKIPPED_NONFINITE = "buffer/skipped_nonfinite_logps"

# name -> why it has no counterpart in another trainer: logged by one backend only (see docs/metrics.md)
REPLAY_AGE_BOUND = "replay/age_bound"
REPLAY_PADDING_ROWS = "replay/padding_rows"
REPLAY_DROPPED_TOO_WIDE = "replay/dropped_too_wide"
REPLAY_MINI_BATCH_ROWS = "replay/mini_batch_rows"
REPLAY_TOKENS = "replay/replay_tokens"
REPLAY_GLOBAL_SEQLEN = "replay/global_seqlen"  # a prefix: verl's _balance_batch logs <prefix>/min, ...
BUFFER_ROW_STORE_BYTES = "buffer/row_store_bytes"
BACKEND_ONLY = {
    REPLAY_AGE_BOUND: "TRL async: min(tau_max, max_staleness), the age bound its queue and buffer share",
    REPLAY_PADDING_ROWS: "verl v1: verl's synthetic padding rows (no loss token) used as spare rows",
    REPLAY_DROPPED_TOO_WIDE: "verl legacy: replayed rows wider than the batch's padded width, left out",
    REPLAY_MINI_BATCH_ROWS: "verl: the mini-batch rows the actor update used (the step plan's row rule)",
    REPLAY_TOKENS: "verl: tokens of the replayed rows, added to verl's perf/ token counts",
    REPLAY_GLOBAL_SEQLEN: "verl v1: verl's own sequence-length balance statistics of the composed batch (a prefix)",
    BUFFER_ROW_STORE_BYTES: "verl v1: the stored rows' packed bytes in the row store (buffer/bytes: the scalars)",
}
# The keys under these namespaces are replay metrics: every one a trainer logs is a constant here or BACKEND_ONLY.
NAMESPACES = ("replay/", "fresh/", "buffer/")

# old name -> name: what TRL and verl logged before the names were one set (recorded runs keep the old keys).
LEGACY = {
    "replay/rows": REPLAY_COUNT,  # TRL
    "replay/replay_rows": REPLAY_COUNT,  # verl
    "replay/fresh_rows": FRESH_COUNT,  # verl
    "replay/abs_adv_replay": REPLAY_ABS_ADV,  # verl
    "replay/buffer_size": BUFFER_SIZE,  # TRL
    "replay/evicted_age_total": BUFFER_EVICTED_AGE,  # TRL
    "replay/evicted_uses_total": BUFFER_EVICTED_USES,  # TRL
    "replay/age_versions/mean": REPLAY_AGE_VERSIONS_MEAN,  # verl v1
    "replay/age_versions/max": REPLAY_AGE_VERSIONS_MAX,
    "replay/age_versions/min": REPLAY_AGE_VERSIONS_MIN,
    "replay/frac_zero_variance": ZERO_VARIANCE_SHARE,  # TRL (a share of rows: of groups, as groups are whole)
}


def canonical(row: Mapping[str, Any]) -> dict[str, Any]:
    """`row` with every LEGACY key renamed, in its order; a key already under its new name wins over its old one."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        new = LEGACY.get(k)
        if new is None:
            out[k] = v
        elif new not in row:
            out[new] = v
    return out


def names() -> set[str]:
    """Every metric name of this module (the constants; `REWARD_FUNC_MEAN` as its template)."""
    return {v for k, v in globals().items() if k.isupper() and isinstance(v, str)} - set(NAMESPACES)


def is_replay_key(key: str) -> bool:
    """Whether `key` names a replay metric (under `NAMESPACES`, or the zero-variance share)."""
    return key.startswith(NAMESPACES) or key == ZERO_VARIANCE_SHARE


def undeclared(keys) -> set[str]:
    """The replay metric keys of `keys` that are neither a name here nor declared in `BACKEND_ONLY`."""
    known = names() - {REPLAY_GLOBAL_SEQLEN}
    prefixes = (REPLAY_GLOBAL_SEQLEN + "/",)
    return {k for k in keys if is_replay_key(k) and k not in known and not k.startswith(prefixes)}
