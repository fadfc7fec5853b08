"""`ReplayRayPPOTrainer`: verl 0.9.1's legacy `RayPPOTrainer` with replay at the narrowest point.

Three overrides, nothing copied from verl:
- `_update_actor(batch)`: `fit()` calls it after rewards, old log-probs, reference log-probs and advantages exist;
  the `ReplayHook` stores the fresh rows (birth step = `self.global_steps`) and concatenates replay rows, then the
  PPO mini-batch is scaled for this one call so the optimizer-step count is unchanged.
- `_save_checkpoint()` / `_load_checkpoint()`: the buffer is written to / read from
  `<default_local_dir>/global_step_<t>/replay_buffer.{npz,json}` beside verl's `actor/` and `data.pt`, and pruned
  with verl's actor checkpoints by the same save, load and prune as the v1 trainer's (checkpoints.py).

This is the legacy trainer (`trainer.use_v1=false`), which verl 0.9.1 still ships; verl's default v1 trainer,
whose rows move through TransferQueue, has its own integration in trainer_v1.py (its stored rows live in a row
store outside TransferQueue).
"""
from __future__ import annotations

from typing import Any

from .... import metric_names as mn
from .._compat import DataProto
from ..checkpoints import load_replay, save_replay
from ..settings import resolve_replay
from ..sizing import mini_batch_scaled, verl_mini_batch
from .hook import ReplayHook

try:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
except ImportError as e:  # pragma: no cover
    from .._compat import INSTALL_HINT

    raise ImportError(f"ReplayRayPPOTrainer needs verl[verl-core] (Ray): {INSTALL_HINT} ({e})") from e

class ReplayRayPPOTrainer(RayPPOTrainer):
    """`RayPPOTrainer` + rollout-level advantage-prioritized replay (config group `replay`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replay_hook = make_hook(self.config)

    # --- Algorithm 1 between advantages and the actor update ------------------------------------------
    def _update_actor(self, batch: DataProto) -> DataProto:
        mb, rollout_n, micro = verl_mini_batch(self.config)
        dp_size = self._get_dp_size(self.actor_rollout_wg, "actor")
        composed = self.replay_hook(
            batch,
            self.global_steps,
            dp_size=dp_size,
            mini_batch_rows=mb,
            group_size=rollout_n,
            micro_batch_size_per_gpu=micro,
            prefix_grouper=bool(getattr(self, "use_prefix_grouper", False)),
        )
        plan = self.replay_hook.last_plan
        metrics = dict(plan.metrics)
        replay_token_num = composed.meta_info["global_token_num"][plan.n_fresh_used :]
        changed = plan.n_replay > 0 or plan.n_fresh_used != plan.n_fresh_total
        if self.replay_hook.settings.rebalance and self.config.trainer.balance_batch and changed:
            balance = {}
            self._balance_batch(composed, metrics=balance, logging_prefix=mn.REPLAY_GLOBAL_SEQLEN)
            composed.meta_info["global_token_num"] = composed.batch["attention_mask"].sum(-1).tolist()
            metrics.update(balance)
        # verl's _update_actor passes ppo_mini_batch_size * rollout.n rows as the PPO mini-batch; scale it for
        # this call so the composed batch gives exactly plan.n_mini_batches optimizer steps per epoch.
        with mini_batch_scaled(self.config, plan.mini_batch_rows):
            output = super()._update_actor(composed)
        # fit() computes perf/total_num_tokens and perf/throughput from the fresh batch's global_token_num after
        # this call: the replayed rows are trained on too, so their tokens count (nothing else reads the list).
        if "global_token_num" in batch.meta_info:
            batch.meta_info["global_token_num"] = list(batch.meta_info["global_token_num"]) + replay_token_num
        output.meta_info.setdefault("metrics", {}).update(metrics)
        return output

    # --- the buffer travels with verl's checkpoints -------------------------------------------------------
    def _save_checkpoint(self):
        return save_replay(self.replay_hook, self.config, self.global_steps, super()._save_checkpoint)

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        load_replay(self.replay_hook, self.config, self.global_steps)
        return out


def make_hook(config: Any) -> ReplayHook:
    """The trainer's hook, with the `replay` group resolved once (`resolve_replay`, as the v1 trainer does)."""
    return ReplayHook(*resolve_replay(config))
