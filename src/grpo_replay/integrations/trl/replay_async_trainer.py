"""`ReplayAsyncGRPOTrainer`: TRL's `AsyncGRPOTrainer` (trl.experimental.async_grpo) with rollout-level,
advantage-prioritized experience replay. The replay step itself is `AsyncComposer` (async_composer.py).

Hook points (narrow; no TRL method body is copied):
- `get_train_dataloader`: super(), then, on the main process (the only one that reads the rollout queue: TRL
  dispatches every micro-batch from it), the composer goes between `RolloutQueueDataset` and the planner, the queue
  is wrapped to keep each sample's model-version stamp, and the collator records which samples each micro-batch
  holds.
- `training_step`: super(), then that micro-batch's samples are marked trained on (fresh ones become storable); at the
  end of each accumulation window the step's replay metrics are logged.
- `_save_checkpoint` / `_inner_training_loop`: the buffer and the composer's state (samples trained on but not yet
  stored, samples handed to the planner but not yet trained on, the model version, and the rollout worker's state
  when it has a `state_dict`) are saved in each checkpoint and restored on `resume_from_checkpoint`.
- `compute_loss` (only under `replay.max_drift`): TRL's loss, with the replayed samples whose drift on its forward
  exceeds the bound left out of its terms and normaliser, and evicted (async_drift.py).
- `log`: the cumulative eviction counters are logged as totals.

With replay off (replay_ratio == 0, e.g. the grpo preset) nothing is wrapped: the trainer is AsyncGRPOTrainer.
"""
from __future__ import annotations

import inspect
import os
from collections import deque
from typing import Any, Optional

import torch
from accelerate.logging import get_logger
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

from ... import metric_names as mn
from ...config import ReplayConfig
from ...errors import ConfigError
from ...step_metrics import ReplayRecord, step_row
from ...tally import Tally
from .async_composer import AsyncComposer, check_chunk, chunk_holds, chunk_size
from .async_drift import SEQ_KEY, Measured, bounded_loss, reached_loss, row_seqs
from .async_samples import AGE, IS_REPLAY, SERIAL, check_behaviour_logps, sample_state, zero_variance
from .master_weights import check_master_weights
from .replay_async_config import check_age_bound
from .replay_fields import resolve_replay_config

logger = get_logger(__name__)

BUFFER_FILE = "replay_buffer"  # + .npz / .json inside checkpoint-<step>/ (one buffer: the main process's)
STATE_FILE = "replay_async_state.pt"


class ReplayAsyncGRPOTrainer(AsyncGRPOTrainer):
    """AsyncGRPOTrainer + replay. Takes AsyncGRPOTrainer's arguments; the replay settings come from `args` when it is
    a `ReplayAsyncGRPOConfig`, else from `replay_config` (default: the paper preset). Both given and different:
    ConfigError naming the fields that differ."""

    def __init__(self, *args: Any, replay_config: Optional[ReplayConfig] = None, **kwargs: Any) -> None:
        bound = inspect.signature(AsyncGRPOTrainer.__init__).bind(None, *args, **kwargs).arguments
        targs, worker = bound.get("args"), bound.get("rollout_worker")
        replay_config = resolve_replay_config("ReplayAsyncGRPOTrainer", targs, replay_config)
        # Refused before AsyncGRPOTrainer loads anything.
        staleness = targs.max_staleness if targs is not None else AsyncGRPOConfig.max_staleness
        age_bound = check_age_bound(replay_config, staleness)
        if replay_config.enabled and getattr(worker, "provides_behaviour_logps", True) is False:
            raise ConfigError(
                f"ReplayAsyncGRPOTrainer: rollout_worker={type(worker).__name__} returns no behaviour log-probs "
                "(provides_behaviour_logps = False); replay stores the sampler's log-probs of every row it replays. "
                "allowed: a worker that returns them in RolloutSample.old_log_probs (TRL's AsyncRolloutWorker does), "
                "or replay_ratio=0"
            )
        super().__init__(*args, **kwargs)
        check_master_weights(self.model, self.args.learning_rate, self.accelerator.mixed_precision,
                             self.accelerator.is_fsdp2)
        self.replay_config = replay_config
        self.replay_age_bound = age_bound
        self.replay_history: deque[ReplayRecord] = deque(maxlen=10_000)  # one record per optimizer step (main)
        self.replay_keep_samples = False  # True: records also hold the trained samples (tests, diagnostics)
        # Samples in this process's packed row, one entry per micro-batch (diagnostics, tests).
        self.replay_rows_per_process: deque[int] = deque(maxlen=100_000)
        self._replay_collated: deque[list[int]] = deque()
        self._replay_step: list[dict[str, Any]] = []
        self._replay_drift: list[Measured] = []  # this step's micro-batches, under max_drift
        self._replay_drift_on = replay_config.enabled and replay_config.max_drift is not None
        self.replay_composer: Optional[AsyncComposer] = None
        size = chunk_size(self.args, self.accelerator.num_processes)  # the preflight reports the same S
        if replay_config.enabled:  # every process refuses alike, before training
            plan = check_chunk(replay_config, size, self.args.num_generations)
            logger.info(f"ReplayAsyncGRPOTrainer: {chunk_holds(replay_config, plan)}")
        if replay_config.enabled and self.accelerator.is_main_process:
            seed = getattr(self.args, "replay_seed", None)
            self.replay_composer = AsyncComposer(replay_config, staleness, size,
                                                 seed=self.args.seed if seed is None else seed,
                                                 version=lambda: self.model_version, group_size=self.args.num_generations)
            logger.info(f"ReplayAsyncGRPOTrainer: replayed rows are 1 to {age_bound} model versions old "
                        f"(min(tau_max={replay_config.tau_max}, max_staleness={self.args.max_staleness}))")

    # --- the data path ----------------------------------------------------------------------------------
    def get_train_dataloader(self):
        loader = super().get_train_dataloader()
        if self.replay_composer is None:
            return loader
        base = loader.base_dataloader
        planner = base.dataset  # FixedCountBatcher or TokenBudgetBatcher, over a RolloutQueueDataset
        source = planner.dataset
        stamps = _StampingQueue(source.queue)
        source.queue = stamps
        planner.dataset = _ComposedSamples(self.replay_composer, source, stamps)
        base.collate_fn = _RecordingCollator(base.collate_fn, self._replay_collated, self._replay_drift_on)
        return loader

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not self._replay_drift_on:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        loss, measured = bounded_loss(self, super().compute_loss, model, inputs, self.replay_config.max_drift,
                                      return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if self.replay_composer is not None:  # the main process: the buffer's
            self.replay_composer.session.evict_drifted(measured.seqs[measured.dropped])
            self._replay_drift.append(measured)
        return loss

    def training_step(self, model, inputs, num_items_in_batch):
        out = super().training_step(model, inputs, num_items_in_batch)
        selected = inputs["token_index"] >= 0
        self.replay_rows_per_process.append(int(torch.unique(inputs["segment_id"][selected]).numel()))
        if self.replay_composer is not None and self._replay_collated:
            self._replay_step += self.replay_composer.trained(self._replay_collated.popleft())
        if self.accelerator.sync_gradients:
            self._replay_log_step()
        return out

    # --- checkpointing ----------------------------------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.replay_composer is None:
            return
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        os.makedirs(folder, exist_ok=True)
        self.replay_composer.session.save(os.path.join(folder, BUFFER_FILE))
        worker = self.rollout_worker
        state = {"composer": self.replay_composer.state_dict(), "model_version": int(self.model_version),
                 "worker": worker.state_dict() if hasattr(worker, "state_dict") else None}
        torch.save(state, os.path.join(folder, STATE_FILE))

    def _inner_training_loop(self, *args, **kwargs):
        checkpoint = kwargs.get("resume_from_checkpoint")
        if checkpoint is not None and self.replay_composer is not None:
            self._replay_restore(checkpoint)
        return super()._inner_training_loop(*args, **kwargs)

    def _replay_restore(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.exists(path):
            logger.warning(f"ReplayAsyncGRPOTrainer: no replay state in {checkpoint} (saved without replay); "
                           "the buffer starts empty.")
            return
        state = torch.load(path, weights_only=True)
        self.replay_composer.load_state_dict(state["composer"], os.path.join(checkpoint, BUFFER_FILE))
        worker = self.rollout_worker
        if not isinstance(worker, AsyncRolloutWorker):  # TRL restores its own worker's version and position
            # The train-begin weight sync publishes the checkpoint's weights as the next version: one below the
            # saved one, so they get the number they had when saved and ages continue as in an unbroken run.
            self.model_version = int(state["model_version"]) - 1
            worker.update_model_version(self.model_version)
            if state["worker"] is not None and hasattr(worker, "load_state_dict"):
                worker.load_state_dict(state["worker"])

    # --- logging (TRL's metric sink: reduced per logging window by TRL, main process) ------------------
    def _replay_log_step(self) -> None:
        metrics = self._metrics["train"]
        if self.replay_composer is None:
            if self.accelerator.is_main_process:
                metrics[mn.REPLAY_SHARE].append(0.0)
            return
        samples, self._replay_step = self._replay_step, []
        fresh = [s for s in samples if not s[IS_REPLAY]]
        composer = self.replay_composer
        measured, self._replay_drift = self._replay_drift, []
        counted = reached_loss(samples, measured)  # the row counts are of the samples that reached the loss
        tally = Tally.of_values(torch.tensor([bool(s[IS_REPLAY]) for s in counted], dtype=torch.bool),
                                torch.tensor([float(s["advantage"]) for s in counted], dtype=torch.float32), None,
                                torch.tensor([int(s[AGE]) for s in counted], dtype=torch.long))
        # The zero-variance share counts fresh samples (a group's samples may fall in different steps).
        tally.update(groups=float(len(fresh)), zero_variance_groups=float(sum(map(zero_variance, fresh))))
        if self._replay_drift_on:  # over every replayed sample trained on, the dropped ones included
            tally.update(Tally.of_drift_values(torch.cat([m.drift for m in measured]) if measured else None,
                                               torch.cat([m.dropped for m in measured]) if measured
                                               else torch.zeros(0, dtype=torch.bool)))
        inserted = composer.take_inserted()
        row = step_row(tally, inserted=float(inserted), buffer={mn.BUFFER_SIZE: float(len(composer.buffer))},
                       skipped_nonfinite=float(composer.session.take_skipped_nonfinite()), lists=False)
        for k, v in row.items():
            metrics[k].append(float(v))
        metrics[mn.REPLAY_AGE_BOUND].append(float(self.replay_age_bound))
        replay = [s for s in samples if s[IS_REPLAY]]
        heavy = {"samples": [sample_state(s) for s in samples]} if self.replay_keep_samples else {}
        self.replay_history.append(ReplayRecord.of(
            step=self.state.global_step, version=self.model_version, fresh_rows=len(fresh), replay_rows=len(replay),
            inserted=inserted, buffer_size=len(composer.buffer), replay_birth_steps=[s["model_version"] for s in replay],
            replay_ages=[s[AGE] for s in replay], replay_advantages=[float(s["advantage"]) for s in replay],
            fresh_advantages=[float(s["advantage"]) for s in fresh], **heavy))

    def log(self, logs: dict[str, float], start_time: Optional[float] = None) -> None:
        if self.replay_composer is not None and "loss" in logs:  # a training row, not the end-of-run summary
            # Cumulative counters, as ReplayGRPOTrainer logs them (TRL sums a "total" key over the window).
            totals = self.replay_composer.session.totals()
            totals.pop(mn.BUFFER_SIZE)  # logged per step, with the step's other metrics
            for k, v in step_row(buffer=totals).items():
                self._metrics["train"][k] = [v]
        super().log(logs, start_time)


class _StampingQueue:
    """The rollout queue, remembering the last sample taken (TRL's dataset yields it without its version stamp)."""

    def __init__(self, inner):
        self.inner, self.last = inner, None

    def get(self, *args, **kwargs):
        self.last = self.inner.get(*args, **kwargs)
        return self.last

    def qsize(self) -> int:
        return self.inner.qsize()


class _ComposedSamples(torch.utils.data.IterableDataset):
    """What the planner iterates: the composer's stream over the queue's fresh samples, stamped."""

    def __init__(self, composer: AsyncComposer, source, stamps: _StampingQueue):
        self.composer, self.source, self.stamps = composer, source, stamps

    def __iter__(self):
        return self.composer.stream(self._stamped())

    def _stamped(self):
        for sample in self.source:  # yielded right after the queue handed over self.stamps.last
            sample["model_version"] = int(self.stamps.last.model_version)
            check_behaviour_logps(sample)
            yield sample


class _RecordingCollator:
    """TRL's collator, recording the serials of each micro-batch's samples (in the order they are collated, which is
    the order they are trained on); with `seqs`, the batch also names each row's replayed samples (`SEQ_KEY`)."""

    def __init__(self, inner, log: deque, seqs: bool):
        self.inner, self.log, self.seqs = inner, log, seqs

    def __call__(self, examples):
        (rows,) = examples
        self.log.append([s[SERIAL] for row in rows for s in row.samples])
        batch = self.inner(examples)
        if self.seqs:  # replay.max_drift: which of each row's samples are replayed rows, and which (async_drift.py)
            batch[SEQ_KEY] = row_seqs(rows)
        return batch
