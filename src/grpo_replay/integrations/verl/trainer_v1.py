"""Replay on verl 0.9.1's v1 trainer (`trainer.use_v1=true`, verl's default), in its three trainer modes.

`ReplayV1Mixin` overrides five methods of verl's `PPOTrainer`, nothing copied from verl:
- `_update_actor(batch, metrics)`: v1's `_step_once` calls it after `_balance_batch`, `_compute_old_log_prob`,
  (`_compute_ref_log_prob`) and `_compute_advantage`, so every fresh row in TransferQueue holds its final
  `old_log_probs`, `advantages` (and `rollout_is_weights`, `ref_log_prob` where configured). Replay rows are
  stored rows (v1_store.py) rebuilt into keys of their own in the same partition for this update and cleared
  after it: appended to the batch's keys, they reach the actor exactly as they were stored. The PPO mini-batch
  is scaled for this call so the optimizer-step count is unchanged, and the composed batch is a multiple of
  every size verl divides it by, so verl's padding
  path (whose template copies the first row's `old_log_probs` / `advantages`) never runs on it. Padding rows
  verl added before the old log-probs (tag `is_padding`, `response_mask` 0) are filler like zero-variance rows:
  used to reach that multiple, never stored. The real fresh rows are then kept in the row store. It returns
  verl's fresh batch: `fit()` clears exactly the keys it sampled.
- `step`: the copied rows (deferred in the session at the copy) enter the buffer after the global step's last local
  update (separate_async runs `parameter_sync_step` of them per version), so no row is replayed within the version
  that trained it fresh.
- `_compute_metrics`: replayed tokens are counted in `perf/total_num_tokens` and `perf/throughput`.
- `_save_checkpoint` / `_load_checkpoint`: the buffer (scalars) and the stored rows (the row store's file) are
  written to `global_step_<t>/` before verl writes `latest_checkpointed_iteration.txt`; once that checkpoint is
  complete, step folders verl no longer keeps an actor checkpoint for lose them (checkpoints.py, as on the legacy
  trainer).

Age is counted in policy versions: a row's birth is the oldest weight version that generated it
(`min_global_steps` tag) + 1, so age = global step - birth = how many versions the trained policy is past it;
fresh rows have age 0 in sync mode and `tau_max` bounds replay rows to ages 1..tau_max.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from ... import metric_names as mn
from ...loss import token_drift
from ...session import over_drift_bound
from ...step_metrics import step_row
from ...tally import Tally
from .checkpoints import load_replay, resume_folder, save_replay
from .sizing import batch_unit, mini_batch_scaled, scaled_mini_batch, verl_mini_batch
from .v1_checks import check_config, replay_settings
from .row_store import RowStore, remote_row_store
from .v1_store import READ_FIELDS, TQReplayStore, is_store_key, read_fresh

try:
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
except ImportError as e:  # pragma: no cover
    from ._compat import INSTALL_HINT

    raise ImportError(f"the v1 replay trainer needs verl[verl-core] (TransferQueue): {INSTALL_HINT} ({e})") from e

logger = logging.getLogger(__name__)


class ReplayV1Mixin:
    """Replay for a v1 `PPOTrainer` subclass (put it first in the bases)."""

    def __init__(self, config):
        mode = config.trainer.v1.trainer_mode
        if mode not in REPLAY_CLASSES:
            replay_trainer_cls(mode)  # raises, naming the field and the allowed modes
        resolved = replay_settings(config)  # once: the store keeps them for every step
        check_config(config, resolved)
        logger.info(resolved.note)
        # the stored rows in an actor of their own (replay off: none is ever stored)
        enabled = resolved.config.enabled
        self.replay_store = TQReplayStore(resolved.config, resolved.settings,
                                          rows=remote_row_store() if enabled else RowStore(),
                                          engine_age_bound=resolved.bound)
        self.replay_metrics: dict[str, float] = {}
        self._replay_tokens = 0
        super().__init__(config)

    # --- Algorithm 1 between advantages and the actor update ------------------------------------------
    def _update_actor(self, batch: "KVBatchMeta", metrics: dict) -> "KVBatchMeta":
        store, step, pid = self.replay_store, int(self.global_steps), batch.partition_id
        fresh = read_fresh(tq, batch.keys, batch.tags, pid, step)
        # verl's synthetic padding rows (response_mask 0, tag is_padding): spare rows after the zero-variance ones
        pad_keys = [k for k, t in zip(batch.keys, batch.tags) if t.get("is_padding", False)]
        pad_tags = [t for t in batch.tags if t.get("is_padding", False)]
        mb, rollout_n, micro = verl_mini_batch(self.config)
        keep_steps = store.settings.keep_optimizer_steps
        k_steps, unit = batch_unit(len(batch), mb, self._dp_size(), micro, rollout_n, keep_steps)
        n = len(fresh)
        # composed and fitted to verl's unit by the core (step_plan): spare rows are the zero-variance rows left
        # out, then verl's padding rows
        plan = store.compose(fresh, step, unit=unit, n_pad=len(pad_keys))
        used, n_rep = plan.fresh_used, len(plan.replay_ids)
        # in verl's (balanced) order: with nothing replayed or left out the update is verl's own batch
        where = {k: j for j, k in enumerate(batch.keys)}
        position = np.array([where[k] for k in fresh.keys + pad_keys], dtype=np.int64)
        used = used[np.argsort(position[used], kind="stable")]
        replay_keys: list = []
        try:
            replay_keys, replay_tags, fields = store.put_replay(tq, plan.replay_ids[:n_rep], pid)
            # rows this draw evicted (age, capacity, replay.max_uses) leave the row store; those replayed now are
            # in TransferQueue for this update
            store.drop_evicted()
            drift = self._drift_bound(batch, replay_keys, replay_tags, plan.replay_ids[:n_rep], fields)
            composed = self._composed_meta(batch, fresh, used, replay_keys, replay_tags, fields, pad_keys, pad_tags)
            replay_tokens = sum(int(t.get("seq_len", 0)) for t in replay_tags)
            self._replay_tokens += replay_tokens  # per global step: separate_async calls this once per local update
            mb_rows = scaled_mini_batch(len(composed), k_steps, mb, keep_steps)[0]
            with mini_batch_scaled(self.config, mb_rows):
                changed = n_rep > 0 or len(used) != len(batch)
                if store.settings.rebalance and self.config.trainer.balance_batch and changed:
                    composed = self._balance_batch(composed, metrics=metrics, logging_prefix=mn.REPLAY_GLOBAL_SEQLEN)
                super()._update_actor(composed, metrics)
        finally:
            store.take_back(tq, replay_keys, pid)
        # replay off (replay=grpo): nothing is ever drawn, so nothing is stored either
        n_ins = self._stage(fresh, np.flatnonzero(plan.nonzero), pid) if store.config.enabled else 0
        fresh_adv = fresh.advantages[torch.from_numpy(used[used < n])]
        metrics.update(self._replay_log(plan, fresh_adv, int((used >= n).sum()), n_rep, mb_rows, n_ins, step,
                                        replay_tokens, drift))
        return batch

    def _drift_bound(self, batch, keys: list, tags: list, ids: np.ndarray, fields: list):
        """replay.max_drift: each replay row's drift (`loss.token_drift`, the built-in trainer's measure) from the
        policy about to update, its log-probs computed by verl's actor as `_compute_old_log_prob` computes a fresh
        row's; a row above the bound keeps its place in the batch (the batch's size is verl's unit) with its
        `response_mask` (and `loss_mask`) zeroed, so it leaves the loss, whose token mean is then over the rows
        kept, and it is evicted. Returns ((R,) drift, (R,) dropped) in `keys`' order; None without the option."""
        store = self.replay_store
        if store.config.max_drift is None or not keys:
            return None
        pid = batch.partition_id
        once = list(dict.fromkeys(keys))
        tag_of = dict(zip(keys, tags))
        extra = {**batch.extra_info, "calculate_entropy": True, "compute_loss": False,
                 "temperature": self.config.actor_rollout_ref.rollout.temperature}
        self.actor_rollout_wg.compute_log_prob(KVBatchMeta(partition_id=pid, keys=once, tags=[tag_of[k] for k in once],
                                                           fields=fields, extra_info=extra))
        data = tq.kv_batch_get(keys=once, partition_id=pid, select_fields=["log_probs", "old_log_probs", "response_mask"])
        masks = list(data["response_mask"].unbind())
        # the model's output is over prompt + response, shifted by one (verl's response_from_nested)
        current = [lp[len(lp) - len(m) - 1 : len(lp) - 1] for lp, m in zip(data["log_probs"].unbind(), masks)]
        pad = lambda xs: torch.nn.utils.rnn.pad_sequence(list(xs), batch_first=True)  # noqa: E731
        per_key = dict(zip(once, token_drift(pad(current).float(), pad(data["old_log_probs"].unbind()).float(),
                                             pad(masks)).tolist()))
        drift = torch.tensor([per_key[k] for k in keys], dtype=torch.float32)
        dropped = over_drift_bound(torch.ones(len(keys), dtype=torch.bool), drift, store.config.max_drift)
        gone = list(dict.fromkeys(k for k, d in zip(keys, dropped.tolist()) if d))
        if gone:
            from verl.utils.tensordict_utils import list_of_dict_to_tensordict

            zeroed = [f for f in ("response_mask", "loss_mask") if f in fields]
            cur = tq.kv_batch_get(keys=gone, partition_id=pid, select_fields=zeroed)
            rows = [{f: torch.zeros_like(cur[f][j]) for f in zeroed} for j in range(len(gone))]
            tq.kv_batch_put(keys=gone, partition_id=pid, fields=list_of_dict_to_tensordict(rows))
            seqs = np.unique(np.asarray(ids)[dropped.numpy()])
            store.session.evict_drifted(seqs)
            store.drop_evicted()  # their stored rows leave the row store too
        return drift, dropped

    def _stage(self, fresh, rows: np.ndarray, pid: str) -> int:
        """Keep the rows in the row store now (fit() clears the fresh keys after the step), deferred in the
        session; `step` flushes them into the buffer."""
        return len(self.replay_store.copy_rows(tq, fresh, rows, pid, int(self.global_steps)))

    def step(self, metrics: dict, timing_raw: dict):
        # Algorithm 1 step 7 once per global step, after every local update of it: in separate_async one version
        # spans several `_update_actor` calls, and a row is replayed only from the next version on (age >= 1).
        batch = super().step(metrics, timing_raw)
        self.replay_store.flush()  # the rows it evicts (capacity) leave the row store
        return batch

    def _dp_size(self) -> int:
        wg = self.actor_rollout_wg
        if "actor" not in wg._dispatch_info:
            wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
        return max(wg._dispatch_info["actor"]) + 1

    def _composed_meta(self, batch, fresh, used: np.ndarray, replay_keys: list, replay_tags: list, fields: list,
                       pad_keys: list, pad_tags: list) -> "KVBatchMeta":
        """Keys of the update: `used` indexes the fresh rows, then verl's padding rows (index >= len(fresh)),
        followed by the replay rows. With replay rows the update reads the fields they were stored with (the
        fresh rows' fields but those verl's actor update never reads)."""
        n = len(fresh)
        keys = [fresh.keys[i] if i < n else pad_keys[i - n] for i in used] + list(replay_keys)
        tags = [fresh.tags[i] if i < n else pad_tags[i - n] for i in used] + list(replay_tags)
        return KVBatchMeta(
            partition_id=batch.partition_id, keys=keys, tags=tags,
            fields=update_fields(batch.fields, fields) if replay_keys else batch.fields,
            extra_info=dict(batch.extra_info),
        )

    def _replay_log(self, plan, fresh_adv, n_pad, n_rep, mb_rows, n_ins, step, replay_tokens, drift) -> dict:
        """The step's replay metrics (`step_row`): the tally of the rows that reached the loss (fresh_adv: (F,) the
        used fresh rows' advantages; the first n_rep of the plan's replay rows less max_drift's dropped ones), ages
        in policy versions, the inserted rows and the buffer, then verl's own entries (`metric_names.BACKEND_ONLY`)."""
        kept = np.ones(n_rep, dtype=bool) if drift is None else ~drift[1].numpy()
        ages = (step - plan.replay_birth[:n_rep])[kept]  # in policy versions, beside training/off_policy/...
        F, R = len(fresh_adv), int(kept.sum())
        tally = Tally.of_values(torch.cat([torch.zeros(F, dtype=torch.bool), torch.ones(R, dtype=torch.bool)]),
                                torch.cat([torch.as_tensor(fresh_adv, dtype=torch.float32).reshape(-1),
                                           torch.from_numpy(plan.replay_adv[:n_rep][kept]).float()]), None,
                                torch.cat([torch.zeros(F, dtype=torch.long), torch.from_numpy(ages).long()]))
        tally.update(groups=float(len(plan.nonzero)), zero_variance_groups=float((~plan.nonzero).sum()))
        if self.replay_store.config.max_drift is not None:  # (drift, dropped) of this update's replay rows
            d, dropped = drift if drift is not None else (None, torch.zeros(0, dtype=torch.bool))
            tally.update(Tally.of_drift_values(d, dropped))
        row = step_row(tally, inserted=float(n_ins), buffer=self.replay_store.session.buffer_metrics(step),
                       ages_in_versions=True, lists=False)
        out = {k: float(v) for k, v in row.items()}
        if R:
            out[mn.REPLAY_AGE_VERSIONS_MIN] = float(ages.min())
        out.update({mn.REPLAY_PADDING_ROWS: float(n_pad), mn.REPLAY_MINI_BATCH_ROWS: float(mb_rows),
                    mn.REPLAY_TOKENS: float(replay_tokens)})
        if self.replay_store.config.enabled:  # the stored rows' packed bytes, in the row store's actor
            out[mn.BUFFER_ROW_STORE_BYTES] = float(self.replay_store.rows.nbytes())
        self.replay_metrics = out
        return out

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        extra, self._replay_tokens = self._replay_tokens, 0
        total = metrics.get("perf/total_num_tokens")
        if extra and total:  # the replayed rows were trained on too
            metrics["perf/throughput"] = metrics["perf/throughput"] * (total + extra) / total
            metrics["perf/total_num_tokens"] = total + extra

    # --- the buffer travels with verl's checkpoints -------------------------------------------------------
    def _save_checkpoint(self):
        return save_replay(self.replay_store, self.config, self.global_steps, super()._save_checkpoint)

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        if resume_folder(self.config, self.global_steps) is not None:
            # a replay row left in TransferQueue (it is there only during an update) is cleared
            _clear_keys("train", is_store_key)
        load_replay(self.replay_store, self.config, self.global_steps)
        return out


def update_fields(batch_fields, stored: list) -> list:
    """The fields of an update with replay rows: those of verl's (`batch.fields`: the fields every row of the
    batch has; None: all) that the replay rows were stored with. A field the update reads that they lack is an
    error: verl's worker would drop it silently for every rank holding a replay row."""
    if batch_fields is None:
        return list(stored)
    asked = [batch_fields] if isinstance(batch_fields, str) else list(batch_fields)
    lacking = [f for f in asked if f not in stored and f in READ_FIELDS]
    if lacking:
        raise RuntimeError(f"replay rows were stored without the fields {lacking} this update reads; they were "
                           "stored by a run whose fresh rows lacked them (a changed config on resume?)")
    return [f for f in asked if f in stored]


def _listed(partition_id: str) -> dict:
    """{key: tag} of a TransferQueue partition (empty when it has none)."""
    return (tq.kv_list(partition_id) or {}).get(partition_id, {}) or {}


def _clear_keys(partition_id: str, pred) -> None:
    keys = [k for k in _listed(partition_id) if pred(k)]
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition_id)


class ReplayPPOTrainerSync(ReplayV1Mixin, PPOTrainerSync):
    """verl's v1 `PPOTrainerSync` with replay (not registered: verl's "sync" name keeps its own class)."""


class ReplayPPOTrainerColocateAsync(ReplayV1Mixin, PPOTrainerColocateAsync):
    """verl's v1 `PPOTrainerColocateAsync` with replay (not registered)."""


class ReplayPPOTrainerSeparateAsync(ReplayV1Mixin, PPOTrainerSeparateAsync):
    """verl's v1 `PPOTrainerSeparateAsync` with replay (not registered): each of the `parameter_sync_step` local
    updates of a global step composes its own mini-batch; rows enter the buffer at the end of the global step."""


REPLAY_CLASSES = {
    "sync": ReplayPPOTrainerSync,
    "colocate_async": ReplayPPOTrainerColocateAsync,
    "separate_async": ReplayPPOTrainerSeparateAsync,
}


def replay_trainer_cls(mode: str) -> type:
    """The replay class for a v1 trainer mode (ValueError naming the field for a mode replay does not support)."""
    if mode not in TRAINER_REGISTRY:
        raise ValueError(f"trainer.v1.trainer_mode={mode!r} is not a verl trainer; allowed: {sorted(TRAINER_REGISTRY)}")
    if mode not in REPLAY_CLASSES:
        raise ValueError(
            f"trainer.v1.trainer_mode={mode!r}: grpo-replay supports {sorted(REPLAY_CLASSES)} on verl's v1 trainer; "
            "use one of those or trainer.use_v1=false"
        )
    return REPLAY_CLASSES[mode]
