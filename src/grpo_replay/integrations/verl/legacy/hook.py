"""The replay step for verl: fresh `DataProto` (advantages and old log-probs computed) -> composed `DataProto`.

Framework-light: this module needs only a plain `pip install verl` (`DataProto`), not Ray or the trainer.
It converts verl's padded batch to the core's `RolloutBatch`, runs the core's `compose_batch` over the one
`ReplayBuffer`, converts the replay rows back to verl's layout at the run's fixed widths and concatenates them
with `DataProto.concat`. Algorithm 1 (docs/method.md) at verl global step t:

  3. zero-variance filter: groups (rows sharing a verl `uid`) whose task scores are all equal are dropped from
     the update (when `filter_zero_variance`) and are never inserted;
  4-6. evict by age, sample by priority and compose (fresh-anchored: concatenate) via `compose_batch`;
       replay rows keep their stored advantages, old log-probs (no recompute) and reference log-probs;
  --   the total is trimmed to a multiple of `K * lcm(n, dp * micro)` (K = optimizer steps per epoch of the fresh
       batch, micro = static `ppo_micro_batch_size_per_gpu`, 1 with dynamic batch sizes), so the trainer can scale
       the mini-batch to total / K rows, no extra optimizer step appears and verl's worker can cut every rank's
       share into micro-batches; with the prefix grouper, uid groups are made adjacent and their count a multiple
       of dp;
  7.   the fresh non-zero-variance rows are inserted with birth step t and a stable prompt identity
       (a hash of the unpadded prompt token ids: verl's `uid` is a fresh uuid per step).

verl batch layout at `_update_actor` (read off verl 0.9.1 `agent_loop._postprocess` and `ray_trainer.fit`):
`prompts` (B,P) left-padded, `responses` (B,R) right-padded, `response_mask` (B,R), `input_ids` (B,P+R),
`attention_mask` (B,P+R), `position_ids` (B,P+R), `old_log_probs` (B,R), `advantages` and `returns` (B,R; constant
over the response for outcome estimators such as GRPO), `token_level_scores` / `token_level_rewards` (B,R; the
reward sits on the last response token), optional `rollout_log_probs`, `ref_log_prob`, `rm_scores`,
`rollout_is_weights`; non-tensor `uid` and whatever the dataset and agent loop add.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from ....advantage import group_advantages, nonzero_variance_mask
from ....buffer import ReplayBuffer
from ....composed import ComposedBatch
from ....config import ReplayConfig
from .... import metric_names as mn
from ....rollout import RolloutBatch
from ....session import ReplaySession
from ....step_metrics import step_row
from ....tally import Tally
from .._compat import DataProto
from ....adapter_rows import prompt_key, row_advantages
from ..settings import VerlReplaySettings, check_options, split_config
from ..sizing import batch_unit, scaled_mini_batch
from .uids import adjacent_uid_order, split_uid_runs

logger = logging.getLogger(__name__)

# Tensor keys rebuilt for replay rows from what the buffer stores.
REBUILT_KEYS = (
    "prompts",
    "responses",
    "response_mask",
    "input_ids",
    "attention_mask",
    "position_ids",
    "old_log_probs",
    "rollout_log_probs",
    "ref_log_prob",
    "advantages",
    "returns",
    "token_level_scores",
    "token_level_rewards",
    "rm_scores",
    "rollout_is_weights",
)
REQUIRED_KEYS = ("prompts", "responses", "response_mask", "attention_mask", "old_log_probs", "advantages")
# Keys whose per-row content cannot be reconstructed from a stored rollout: replay is refused.
UNSUPPORTED_KEYS = ("routed_experts", "teacher_logprobs", "teacher_ids", "values")


@dataclass
class ReplayPlan:
    """What the last hook call did (the trainer reads `mini_batch_rows`; `metrics` go to the logger)."""

    step: int
    n_fresh_total: int
    n_fresh_used: int
    n_zero_variance: int
    n_replay: int
    n_total: int
    n_inserted: int
    mini_batch_rows: int
    n_mini_batches: int
    n_replay_tokens: int = 0
    """Prompt + response tokens of the replay rows (verl's perf/total_num_tokens counts them too)."""
    metrics: dict[str, float] = field(default_factory=dict)


# The task score first: with algorithm.use_kl_in_reward, token_level_rewards = scores - beta * KL per token, so
# its row sum almost never ties within a group and the zero-variance filter would keep every group.
REWARD_KEYS = ("token_level_scores", "rm_scores", "token_level_rewards")


def _row_rewards(batch: "DataProto") -> torch.Tensor:
    td = batch.batch
    for key in REWARD_KEYS:
        if key in td.keys():
            return td[key].float().sum(-1)
    raise KeyError(f"the batch has none of {list(REWARD_KEYS)}: rewards are unknown")


def _group_ids(batch: "DataProto") -> torch.Tensor:
    if "uid" not in batch.non_tensor_batch:
        raise KeyError("the batch has no non-tensor 'uid': GRPO groups are unknown")
    _, inv = np.unique(np.asarray(batch.non_tensor_batch["uid"]).astype(str), return_inverse=True)
    return torch.from_numpy(inv.astype(np.int64).reshape(-1))


def to_rollout_batch(batch: "DataProto", step: int) -> tuple[RolloutBatch, np.ndarray]:
    """verl fresh batch -> (RolloutBatch with is_replay False and birth step `step`, prompt keys (B,) int64)."""
    td = batch.batch
    missing = [k for k in REQUIRED_KEYS if k not in td.keys()]
    if missing:
        raise KeyError(f"the batch lacks {missing}: call the replay hook after advantages and old log-probs exist")
    P = td["prompts"].shape[1]
    prompt_ids = td["prompts"].long()
    prompt_mask = td["attention_mask"][:, :P].long()
    completion_mask = td["response_mask"].long()
    rewards = _row_rewards(batch)
    gids = _group_ids(batch)
    _, std = group_advantages(rewards, gids)
    rb = RolloutBatch.fresh(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=td["responses"].long(),
        completion_mask=completion_mask,
        behaviour_logps=td["old_log_probs"].float(),
        advantages=row_advantages(td["advantages"], completion_mask),
        rewards=rewards,
        group_ids=gids,
        group_std=std,
        step=step,
        ref_logps=td["ref_log_prob"].float() if "ref_log_prob" in td.keys() else None,
    )
    pids, pm = prompt_ids.cpu().numpy(), prompt_mask.cpu().numpy().astype(bool)
    keys = np.array([prompt_key(pids[i][pm[i]]) for i in range(len(rb))], dtype=np.int64)
    return rb, keys


def _fitting_widths(rows: RolloutBatch, template: "DataProto", out: list) -> torch.Tensor:
    """(R,) bool: the drawn replay `rows` that fit verl's widths; appends (their DataProto, rows dropped) to `out`."""
    dp, fits = to_dataproto(rows, template)
    out.append((dp, len(rows) - len(fits)))
    keep = torch.zeros(len(rows), dtype=torch.bool)
    keep[torch.from_numpy(np.asarray(fits, dtype=np.int64))] = True
    return keep


def to_dataproto(rows: RolloutBatch, template: "DataProto") -> tuple["DataProto", np.ndarray]:
    """Replay rows -> DataProto with the template's tensor keys, dtypes and fixed widths (P, R).

    Returns (DataProto, kept): rows whose prompt or completion does not fit the widths are dropped (`kept` are the
    indices into `rows` that were converted; verl runs have fixed widths, so this happens only if they changed).
    """
    td = template.batch
    keys = list(td.keys())
    bad = [k for k in UNSUPPORTED_KEYS if k in keys]
    if bad:
        raise ValueError(f"replay cannot rebuild {bad} for stored rollouts (router replay / distillation / critic)")
    if td["position_ids"].dim() != 2 or td["input_ids"].dim() != 2:
        raise ValueError("replay supports text-only batches (2-D position_ids); multi-modal rope is not supported")
    P, R = td["prompts"].shape[1], td["responses"].shape[1]
    plen = rows.prompt_lengths()
    clen = rows.completion_lengths()
    kept = torch.nonzero((plen <= P) & (clen <= R)).flatten()
    rows = rows.select(kept)
    plen, clen = plen[kept], clen[kept]
    n = len(rows)

    prompts = torch.zeros(n, P, dtype=torch.long)
    pmask = torch.zeros(n, P, dtype=torch.long)
    responses = torch.zeros(n, R, dtype=torch.long)
    rmask = torch.zeros(n, R, dtype=torch.long)
    ratt = torch.zeros(n, R, dtype=torch.long)
    logps = torch.zeros(n, R, dtype=torch.float32)
    ref = torch.zeros(n, R, dtype=torch.float32) if rows.ref_logps is not None else None
    for i in range(n):
        p, c = int(plen[i]), int(clen[i])
        real = rows.prompt_mask[i].bool()
        prompts[i, P - p :] = rows.prompt_ids[i][real]
        pmask[i, P - p :] = 1
        responses[i, :c] = rows.completion_ids[i, :c]
        rmask[i, :c] = rows.completion_mask[i, :c]
        ratt[i, :c] = 1  # tokens before the last counted one are real (multi-turn tool tokens have mask 0)
        logps[i, :c] = rows.behaviour_logps[i, :c]
        if ref is not None:
            ref[i, :c] = rows.ref_logps[i, :c]
    attention = torch.cat([pmask, ratt], 1)
    adv_tok = rows.advantages.float()[:, None] * rmask.float()
    last = torch.zeros(n, R, dtype=torch.float32)
    has = clen > 0
    last[torch.nonzero(has).flatten(), (clen[has] - 1)] = rows.rewards.float()[has]
    built = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": rmask,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention,
        "position_ids": torch.clip(torch.cumsum(attention, -1) - 1, min=0),  # verl compute_position_id_with_mask
        "old_log_probs": logps,
        "rollout_log_probs": logps,  # behaviour policy at birth (bypass mode: old == rollout)
        "advantages": adv_tok,
        "returns": adv_tok,
        "token_level_scores": last,
        "token_level_rewards": last,
        "rm_scores": last,
        "rollout_is_weights": rmask.float(),  # replay rows get no extra importance weight (docs/method.md)
    }
    if "ref_log_prob" in keys:
        if ref is None:
            raise ValueError("the batch has ref_log_prob but the stored rollouts have none (the KL setting changed)")
        built["ref_log_prob"] = ref
    tensors = {}
    unknown = []
    for k in keys:
        t = td[k]
        if k in built:
            tensors[k] = built[k].to(dtype=t.dtype)
        else:
            unknown.append(k)
            tensors[k] = torch.zeros((n, *t.shape[1:]), dtype=t.dtype)
    if unknown and n:
        warnings.warn(f"replay rows: tensor keys {unknown} are not stored; filled with zeros", stacklevel=2)
    non_tensors = {k: _fill_non_tensor(k, v, rows) for k, v in template.non_tensor_batch.items()}
    meta = {k: v for k, v in template.meta_info.items() if k not in ("metrics", "global_token_num")}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta), kept.numpy()


def _fill_non_tensor(key: str, fresh: np.ndarray, rows: RolloutBatch) -> np.ndarray:
    n = len(rows)
    if key == "uid":
        # rows of one stored group share a uid (verl's prefix grouper and metrics group by it)
        out = np.empty(n, dtype=object)
        out[:] = [f"replay-{int(g)}" for g in rows.group_ids.tolist()]
        return out
    if fresh.dtype != object:
        return np.zeros((n, *fresh.shape[1:]), dtype=fresh.dtype)
    out = np.empty(n, dtype=object)
    if key == "multi_modal_inputs":
        if any(isinstance(x, dict) and x for x in fresh):
            raise ValueError("replay supports text-only batches; multi_modal_inputs are not stored")
        out[:] = [{} for _ in range(n)]
    else:
        out[:] = [None] * n
    return out


class ReplayHook:
    """Owns the `ReplayBuffer` and turns a fresh verl batch into the batch for `_update_actor`.

    `hook(batch, global_step, dp_size=..., mini_batch_rows=...)` returns the composed DataProto; `hook.last_plan`
    says what it did (`mini_batch_rows` is the PPO mini-batch, in rows, that keeps the optimizer-step count).
    """

    def __init__(self, config: Optional[ReplayConfig] = None, settings: Optional[VerlReplaySettings] = None):
        self.config = config or ReplayConfig()
        self.settings = settings or VerlReplaySettings()
        check_options(self.config, self.settings, legacy=True)
        self.session = ReplaySession(self.config, seed=self.settings.seed)
        self.last_plan: Optional[ReplayPlan] = None

    @property
    def buffer(self) -> ReplayBuffer:
        return self.session.buffer

    @classmethod
    def from_dict(cls, cfg: Optional[dict[str, Any]]) -> "ReplayHook":
        config, settings = split_config(cfg)
        return cls(config, settings)

    def __call__(
        self,
        batch: "DataProto",
        global_step: int,
        *,
        dp_size: int = 1,
        mini_batch_rows: Optional[int] = None,
        group_size: int = 1,
        micro_batch_size_per_gpu: Optional[int] = None,
        prefix_grouper: bool = False,
    ) -> "DataProto":
        """Compose the update batch. `mini_batch_rows` = verl's `ppo_mini_batch_size * rollout.n` (default: the
        whole fresh batch, i.e. one optimizer step), `dp_size` = the actor's data-parallel size, `group_size` =
        `rollout.n` (the scaled mini-batch stays a multiple of it), `micro_batch_size_per_gpu` = the actor's
        `ppo_micro_batch_size_per_gpu` with static micro-batches (None with `use_dynamic_bsz`): each rank's share
        of a mini-batch must divide by it. `prefix_grouper` (verl's `actor.use_prefix_grouper`): the number of
        distinct uids is made a multiple of `dp_size` and rows of one uid are adjacent, as verl's group-level
        `_balance_batch` requires."""
        step = int(global_step)
        N = len(batch)
        mb, dp = int(mini_batch_rows or N), int(dp_size)
        K, unit = batch_unit(N, mb, dp, int(micro_batch_size_per_gpu or 1), int(group_size),
                             self.settings.keep_optimizer_steps)

        fresh, pkeys = to_rollout_batch(batch, step)
        nonzero = nonzero_variance_mask(fresh.rewards, fresh.group_ids).numpy()
        used = np.flatnonzero(nonzero) if self.settings.filter_zero_variance else np.arange(N)
        spare = np.flatnonzero(~nonzero) if self.settings.filter_zero_variance else np.array([], dtype=np.int64)

        # Algorithm 1 steps 4-6 through the core, fitted to verl's unit (step_plan: replay rows, then the spare
        # zero-variance rows, then the smallest-|A| fresh rows). n_filtered is the replay count with
        # replay.fill_filtered (ignored otherwise). Replay rows wider than verl's fixed widths leave before the fit.
        wide: list = []
        fitted = self.session.compose(fresh.select(torch.from_numpy(used)), step, n_filtered=len(spare), unit=unit,
                                      spare=len(spare), screen=lambda rows: _fitting_widths(rows, batch, wide))
        replay_dp, n_dropped_wide = wide[0]
        replay_rows = fitted.batch.select(torch.nonzero(fitted.batch.is_replay).flatten())
        n_replay = len(replay_rows)
        if fitted.plan.whole:  # nothing fits: verl's own batch (a multiple of the unit by construction)
            fresh_idx = np.arange(N)
        else:
            fresh_idx = np.concatenate([used[fitted.fresh_index.numpy()], spare[: fitted.plan.pad]]).astype(np.int64)
        fresh_order = np.sort(fresh_idx)
        replay_order = np.arange(n_replay)
        if prefix_grouper:  # verl's group balancing takes runs of equal adjacent uids as the groups
            fresh_order = fresh_order[adjacent_uid_order(batch.non_tensor_batch["uid"][fresh_order])]
            replay_order = adjacent_uid_order(replay_dp.non_tensor_batch["uid"][:n_replay])
        parts = [batch.select_idxs(fresh_order)]
        if n_replay:
            parts.append(replay_dp.select_idxs(replay_order))
        # select_idxs shares meta_info with the caller's batch: give the parts their own, without the per-row
        # global_token_num (DataProto.concat asserts equal non-metric meta_info; it is recomputed below)
        fresh_part = parts[0]
        fresh_part.meta_info = {k: v for k, v in batch.meta_info.items() if k != "global_token_num"}
        out = DataProto.concat(parts) if len(parts) > 1 else fresh_part
        out.meta_info["global_token_num"] = out.batch["attention_mask"].sum(-1).tolist()
        if prefix_grouper:
            out.non_tensor_batch["uid"] = split_uid_runs(out.non_tensor_batch["uid"], dp, n_first=len(fresh_order))
        n_replay_tokens = int(sum(out.meta_info["global_token_num"][len(fresh_order) :]))

        # Algorithm 1 step 7: insert this step's fresh non-zero-variance rows with birth step = global step (the
        # update window is this call: the rows were drawn from before they enter).
        ins = np.flatnonzero(nonzero)
        self.session.defer(fresh.select(torch.from_numpy(ins)), prompt_keys=pkeys[ins])
        n_ins = self.session.flush()

        # the session's tally of the rows trained (fresh ones in `fresh_idx`, then the replayed ones)
        trained = ComposedBatch([fresh.select(torch.from_numpy(np.asarray(fresh_idx, np.int64))),
                                 replay_rows.select(torch.arange(n_replay))])
        tally = Tally.of(trained, step, groups=N, zero_variance_groups=int((~nonzero).sum()))  # rows: groups are whole
        self.last_plan = self._plan(step, N, mb, K, out, fresh_idx, nonzero, tally, n_replay, n_ins, n_dropped_wide,
                                    n_replay_tokens)
        return out

    def _plan(
        self, step: int, N: int, mb: int, K: int, out: "DataProto", fresh_idx: np.ndarray, nonzero: np.ndarray,
        tally: Tally, n_replay: int, n_ins: int, n_dropped_wide: int, n_replay_tokens: int,
    ) -> ReplayPlan:
        """What this call did: row counts, the mini-batch the trainer must use, and the logged metrics."""
        total = len(out)
        mbr, k_steps = scaled_mini_batch(total, K, mb, self.settings.keep_optimizer_steps)
        metrics = {
            mn.REPLAY_DROPPED_TOO_WIDE: float(n_dropped_wide),
            mn.REPLAY_MINI_BATCH_ROWS: float(mbr),
            mn.REPLAY_TOKENS: float(n_replay_tokens),
        }
        # counts, share, |A|, rewards, ages and the zero-variance share from the tally (no replayed rows: no age or
        # |A|, a 0 would be averaged in as if it were one), then the buffer
        row = step_row(tally, buffer=self.session.buffer_metrics(step), lists=False)
        metrics.update({k: float(v) for k, v in row.items()})
        return ReplayPlan(
            step=step,
            n_fresh_total=N,
            n_fresh_used=len(fresh_idx),
            n_zero_variance=int((~nonzero).sum()),
            n_replay=n_replay,
            n_total=total,
            n_inserted=n_ins,
            mini_batch_rows=mbr,
            n_mini_batches=k_steps,
            n_replay_tokens=n_replay_tokens,
            metrics=metrics,
        )

    # --- persistence (the buffer is the only state) -----------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return self.session.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.session.load_state_dict(state)

    def save(self, path) -> None:
        self.session.save(path)

    def load(self, path) -> None:
        self.session.load(path)

    def files(self, path: str) -> list[str]:
        """The files `save(path)` writes: the buffer's."""
        return [path + ".json", path + ".npz"]

    @staticmethod
    def saved_layout_problem(path: str) -> Optional[str]:
        """None: the buffer's own files (ReplayBuffer.load validates them)."""
        return None

