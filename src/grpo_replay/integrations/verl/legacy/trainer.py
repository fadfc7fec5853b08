"""`ReplayRayPPOTrainer`: verl 0.9.1's legacy `RayPPOTrainer` with replay at the narrowest point.

Three overrides, nothing copied from verl:
- `_update_actor(batch)`: `fit()` calls it after rewards, old log-probs, reference log-probs and advantages exist;
  the `ReplayHook` stores the fresh rows (birth step = `self.global_steps`) and concatenates replay rows, then the
  PPO mini-batch is scaled for this one call so the optimizer-step count is unchanged.
- `_save_checkpoint()` / `_load_checkpoint()`: the buffer is written to / read from
  `<default_local_dir>/global_step_<t>/replay_buffer.{npz,json}` beside verl's `actor/` and `data.pt`.

This is the legacy trainer (`trainer.use_v1=false`), which verl 0.9.1 still ships; verl's default v1 trainer,
whose rows move through TransferQueue, has its own integration in trainer_v1.py.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Optional

from .... import metric_names as mn
from .._compat import DataProto
from ..checkpoints import (BUFFER_NAME, remove_buffer_files, resume_files_present, resume_folder, stale_buffer_folders,
                           step_folder)
from ..settings import replay_dict
from ..sizing import micro_batch_rows, mini_batch_scaled
from .hook import ReplayHook

try:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
except ImportError as e:  # pragma: no cover
    from .._compat import INSTALL_HINT

    raise ImportError(f"ReplayRayPPOTrainer needs verl[verl-core] (Ray): {INSTALL_HINT} ({e})") from e

logger = logging.getLogger(__name__)


class ReplayRayPPOTrainer(RayPPOTrainer):
    """`RayPPOTrainer` + rollout-level advantage-prioritized replay (config group `replay`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replay_hook = make_hook(self.config)

    # --- Algorithm 1 between advantages and the actor update ------------------------------------------
    def _update_actor(self, batch: DataProto) -> DataProto:
        rollout_n = int(self.config.actor_rollout_ref.rollout.n)
        actor_cfg = self.config.actor_rollout_ref.actor
        dp_size = self._get_dp_size(self.actor_rollout_wg, "actor")
        composed = self.replay_hook(
            batch,
            self.global_steps,
            dp_size=dp_size,
            mini_batch_rows=int(actor_cfg.ppo_mini_batch_size) * rollout_n,
            group_size=rollout_n,
            micro_batch_size_per_gpu=micro_batch_rows(actor_cfg),
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
        with mini_batch_scaled(actor_cfg, plan.mini_batch_rows // rollout_n):
            output = super()._update_actor(composed)
        # fit() computes perf/total_num_tokens and perf/throughput from the fresh batch's global_token_num after
        # this call: the replayed rows are trained on too, so their tokens count (nothing else reads the list).
        if "global_token_num" in batch.meta_info:
            batch.meta_info["global_token_num"] = list(batch.meta_info["global_token_num"]) + replay_token_num
        output.meta_info.setdefault("metrics", {}).update(metrics)
        return output

    # --- the buffer travels with verl's checkpoints -------------------------------------------------------
    def _save_checkpoint(self):
        # Written before verl's own save so latest_checkpointed_iteration.txt (written last) never points at a
        # folder without a buffer.
        folder = step_folder(self.config.trainer.default_local_dir, self.global_steps)
        save_buffer(self.replay_hook, folder)
        prune_buffers(self.config.trainer.default_local_dir, keep=self.config.trainer.get("max_actor_ckpt_to_keep"))
        return super()._save_checkpoint()

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        folder = resume_folder(self.config, self.global_steps)
        if folder is not None:
            load_buffer(self.replay_hook, folder)
        return out


def make_hook(config: Any) -> ReplayHook:
    cfg = replay_dict(config)
    if cfg is None:
        logger.warning("no `replay` config node: using the paper preset (ReplayConfig.paper())")
    return ReplayHook.from_dict(cfg)


def save_buffer(hook: ReplayHook, folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, BUFFER_NAME)
    hook.save(path)
    logger.info("replay buffer (%d rollouts) saved to %s.{npz,json}", len(hook.buffer), path)
    return path


def load_buffer(hook: ReplayHook, folder: str) -> bool:
    """Load the buffer saved in `folder`. A missing file is an error unless `replay.allow_empty_resume=true`:
    a resumed run with an empty buffer silently trains without replay for up to `tau_max` steps."""
    path = os.path.join(folder, BUFFER_NAME)
    if not resume_files_present(folder, [path + ".json", path + ".npz"], hook.settings.allow_empty_resume):
        return False
    hook.load(path)
    logger.info("replay buffer (%d rollouts) loaded from %s", len(hook.buffer), path)
    return True


def prune_buffers(default_local_dir: str, keep: Optional[int]) -> None:
    """Keep the buffers of the newest `keep` global_step folders (verl prunes actor/ the same way)."""
    for folder in stale_buffer_folders(default_local_dir, keep):
        remove_buffer_files(folder, (".json", ".npz"))
