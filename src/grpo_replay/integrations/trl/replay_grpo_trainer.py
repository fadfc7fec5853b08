"""`ReplayGRPOTrainer`: TRL's `GRPOTrainer` with rollout-level, advantage-prioritized experience replay.

Hook points (all narrow; no TRL method body is copied):
- `_calculate_rewards`: super(), then keep the rewards TRL gathered over all processes (for the zero-variance
  decision, which must see whole groups even when a group straddles processes).
- `_generate_and_score_completions`: super(), then post-process TRL's dict: compose fresh + replay rows with the
  core's `ReplaySession.compose` fitted to TRL's split, queue this step's fresh non-zero-variance rows with a
  completion token for the buffer (birth step = optimizer step), fill every optional key for the replay rows
  (merge_rows.py), recompute `num_items_in_batch` over all processes.
- `_get_per_token_logps_and_entropies` / `_compute_loss`: when TRL computed no `old_per_token_logps` (generation
  aligned with the optimizer step), the fresh rows' behaviour log-probs are the detached log-probs of the update's
  own forward (the policy does not move inside one accumulation window), so replay adds no forward pass; replay
  rows keep their stored log-probs. Also fresh-vs-replay clip fractions.
- `training_step`: at the end of each accumulation window the queued rows enter the buffer. Several generations
  can share one optimizer step (steps_per_generation < gradient_accumulation_steps); inserting only at the
  window's end means no step ever replays rows born at that step.
- `_save_checkpoint` / `_load_optimizer_and_scheduler`: the buffer (one file per process) lives in TRL checkpoints.

Design choices (documented in examples/trl/README.md):
- TRL's fresh rows are kept as TRL produced them, zero-variance groups included (their A = 0, so they add nothing
  to the gradient but the token normaliser, exactly as in plain GRPOTrainer); zero-variance rows and rows without
  a completion token (`mask_truncated_completions`) are never inserted into the buffer. Dropping them from the
  update would make per-process row counts unequal.
- Each process keeps its own buffer (its own rows; seed + process index). The session composes with TRL's split
  as the unit (`step_plan`): the replay count is the one `steps_per_generation` micro-batches hold nearest to the
  ratio, and all processes agree on the row count (the smallest composed count, gathered) before the fit's one
  rule trims: trailing replay rows first (in draw order: the lowest-priority draws go first), then fresh rows of
  smallest |A|.
- Every process runs the same forward passes, since under FSDP or ZeRO-3 a forward is a collective: the extra
  no-grad pass over fresh rows displaced by pool composition (aligned generation) pads each process's rows to the
  largest count over all processes, none included.
- With replay disabled (replay_ratio == 0, e.g. the grpo preset) the trainer is a pass-through: no extra forward,
  no buffer, identical batches to GRPOTrainer.
"""
from __future__ import annotations

import inspect
import os
import warnings
from collections import deque
from typing import Any, Optional

import torch
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ...buffer import ReplayBuffer
from ...config import ReplayConfig
from ... import metric_names as mn
from ...rollout import RolloutBatch
from ...deferred import Deferred
from ...session import ReplaySession
from ...step_metrics import ReplayRecord, step_row
from ...tally import KINDS, Tally
from .batch_share import check_share
from .fresh_rows import fresh_batch
from .merge_rows import COMPLETION_KEYS, PROMPT_KEYS, ROW_KEYS, is_row_value, merge_replay
from .replay_fields import resolve_replay_config
from .master_weights import check_trainer_master_weights
from .records import LossCapture
from .replay_forward import FORWARD_KEYS, DriftCheck, collective_logps, drift_check
from .resume import EpochAlignedSampler, gather_over_processes, load_generation, save_generation, sum_over_processes

REPLAY_FLAG_KEY = "replay_is_replay"  # (B,) bool, travels with the rows through TRL's shuffle/split
# (B,) long: a fresh row's index in its generation's queued rows (-1: not queued, or a replay row). Set only when
# the behaviour log-probs are taken from the update's forward.
ROW_ID_KEY = "replay_row_id"
BUFFER_FILE = "replay_buffer_rank{rank}"  # + .npz / .json, one per process, inside checkpoint-<step>/


class ReplayGRPOTrainer(GRPOTrainer):
    """GRPOTrainer + replay. Takes GRPOTrainer's arguments; the replay settings come from `args` when it is a
    `ReplayGRPOConfig`, else from `replay_config` (default: the paper preset). Both given and different: ConfigError
    naming the fields that differ."""

    def __init__(self, *args: Any, replay_config: Optional[ReplayConfig] = None, **kwargs: Any) -> None:
        targs = inspect.signature(GRPOTrainer.__init__).bind(None, *args, **kwargs).arguments.get("args")
        replay_config = resolve_replay_config("ReplayGRPOTrainer", targs, replay_config)  # before TRL loads anything
        super().__init__(*args, **kwargs)
        check_trainer_master_weights(self)
        self.replay_config = replay_config
        # The share TRL's split leaves: refused here, before training, when it trims planned replay rows.
        self.replay_share = check_share(self.args, replay_config, self.accelerator.num_processes)
        seed = getattr(self.args, "replay_seed", None)
        seed = self.args.seed if seed is None else seed
        self.replay_session = ReplaySession(replay_config, seed=seed + self.accelerator.process_index)
        # One record per generation (train mode): what was composed. For diagnostics and tests; bounded.
        self.replay_history: deque[ReplayRecord] = deque(maxlen=10_000)
        self._replay_rewards_per_func: Optional[torch.Tensor] = None
        self._replay_capture: Optional[LossCapture] = None  # set inside _compute_loss
        # The latest generation's fresh rows, waiting in the session for the end of their accumulation window: the
        # update's forward writes their behaviour log-probs there (aligned generation).
        self._replay_handle: Optional[Deferred] = None
        if self.replay_config.enabled and getattr(self.args, "use_liger_kernel", False):
            warnings.warn("ReplayGRPOTrainer: fresh/replay clip fractions are not logged with the Liger loss.")

    @property
    def replay_buffer(self) -> ReplayBuffer:
        return self.replay_session.buffer

    # --- narrow hooks ---------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._replay_rewards_per_func = rewards_per_func  # gathered over all processes by TRL
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        rewards_per_func, self._replay_rewards_per_func = self._replay_rewards_per_func, None
        if not self.model.training:
            return output
        if not self.replay_config.enabled:
            self._metrics["train"][mn.REPLAY_SHARE].append(0.0)
            return output
        return self._replay_compose(output, rewards_per_func)

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any):
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        ctx = self._replay_capture
        if ctx is not None and kwargs.get("compute_entropy") and ctx.logps is None:  # the loss's own forward
            logps = result[0].detach()
            ctx.logps = logps
            if ctx.row_id is not None:
                self._replay_take_behaviour_logps(ctx, logps)
        return result

    def _compute_loss(self, model, inputs):
        if REPLAY_FLAG_KEY not in inputs:
            return super()._compute_loss(model, inputs)
        inputs = dict(inputs)  # TRL reuses the buffered chunk when num_iterations > 1: do not mutate it
        is_replay = inputs.pop(REPLAY_FLAG_KEY)
        row_id = inputs.pop(ROW_ID_KEY, None)
        self._replay_capture = LossCapture(inputs, is_replay, row_id)
        try:
            loss = super()._compute_loss(model, inputs)
            captured = self._replay_capture.logps
        finally:
            self._replay_capture = None
        if captured is not None:
            self._replay_log_clip(inputs, captured, is_replay)
        return loss

    def _replay_take_behaviour_logps(self, ctx: LossCapture, logps: torch.Tensor) -> None:
        """Aligned generation: the detached log-probs of this forward are the fresh rows' behaviour log-probs.
        They become the fresh rows' `old_per_token_logps` (TRL's own choice when it skips the pass) and are
        copied into the queued rows; replay rows keep their stored log-probs."""
        inputs, is_replay = ctx.inputs, ctx.is_replay
        if "old_per_token_logps" in inputs:  # TRL reads it after this forward returns
            inputs["old_per_token_logps"] = torch.where(is_replay[:, None], inputs["old_per_token_logps"], logps)
        handle, row_id = self._replay_handle, ctx.row_id
        take = row_id >= 0
        if not bool(take.any()):
            return
        if handle is None or handle.waiting < len(handle):
            raise RuntimeError(
                "ReplayGRPOTrainer: a batch carries queued-row ids but no generation is waiting for them"
            )
        handle.fill(row_id[take], logps[take])

    def training_step(self, model, inputs, num_items_in_batch):
        out = super().training_step(model, inputs, num_items_in_batch)
        # transformers sets sync_gradients on the last micro-step of every accumulation window, the short last
        # window of an epoch included; a count of micro-steps (TRL's _step) falls out of phase after one.
        if self.replay_config.enabled and self.accelerator.sync_gradients:
            self._replay_flush(log=True)
        return out

    # --- checkpointing --------------------------------------------------------------------------------
    def _get_train_sampler(self, dataset=None):
        sampler = super()._get_train_sampler(dataset)
        if self.replay_config.enabled and type(sampler) is RepeatSampler:  # a resume keeps the epochs' data order
            return EpochAlignedSampler(sampler, self)
        return sampler

    def _save_checkpoint(self, model, trial):
        self._replay_flush(log=False)  # normally a no-op: the window that just ended has flushed
        super()._save_checkpoint(model, trial)
        if not self.replay_config.enabled:
            return
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        os.makedirs(folder, exist_ok=True)
        self.replay_buffer.save(os.path.join(folder, BUFFER_FILE.format(rank=self.accelerator.process_index)))
        save_generation(self, folder)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or not self.replay_config.enabled:
            return
        load_generation(self, checkpoint)  # every process: it agrees with the others first
        path = os.path.join(checkpoint, BUFFER_FILE.format(rank=self.accelerator.process_index))
        if not os.path.exists(path + ".json"):
            warnings.warn(
                f"ReplayGRPOTrainer: no replay buffer in {checkpoint} for process {self.accelerator.process_index} "
                "(saved without replay, or with fewer processes); the buffer starts empty."
            )
            return
        self.replay_session.load(path)
        self._replay_handle = None

    # --- the replay step --------------------------------------------------------------------------------
    def _replay_compose(self, out: dict[str, Any], rewards_per_func: torch.Tensor) -> dict[str, Any]:
        unknown = [k for k, v in out.items() if is_row_value(v) and k not in PROMPT_KEYS + COMPLETION_KEYS + ROW_KEYS]
        if unknown:
            raise NotImplementedError(
                f"ReplayGRPOTrainer cannot replay rows with the per-row fields {unknown} (vision-language inputs are "
                "not supported); set replay_ratio=0 (preset 'grpo') or use a text-only model."
            )
        if out["advantages"].dim() != 1:
            raise NotImplementedError("ReplayGRPOTrainer expects one advantage per row (shape (B,)).")
        device = self.accelerator.device
        step = int(self.state.global_step)
        n = int(out["advantages"].shape[0])
        self._replay_flush(log=False, before_step=step)  # normally a no-op: each window flushes at its end
        # TRL skips old_per_token_logps when generation is aligned with the optimizer step: the update's own
        # forward then provides the fresh rows' behaviour log-probs (see _replay_take_behaviour_logps).
        aligned = "old_per_token_logps" not in out

        fresh, nonzero_var, has_tokens = fresh_batch(self, out, rewards_per_func, step)
        # The session fits the composed rows to TRL's split: equal counts on every process (`agree`), a multiple of
        # steps_per_generation. replay.fill_filtered: as many replay rows as this process's zero-variance rows (TRL
        # keeps them, A = 0). replay.max_drift: the drifted rows leave the batch and the buffer before the fit.
        checks: list[Optional[DriftCheck]] = []
        fitted = self.replay_session.compose(
            fresh, step, n_filtered=int((~nonzero_var).sum()), unit=int(self.args.steps_per_generation),
            agree=lambda rows: int(self.accelerator.gather(torch.tensor([rows], device=device)).min()),
            screen=lambda replay: _kept_after(checks, drift_check(self, replay)))
        drift = checks[0] if checks else None
        composed, kept = fitted.batch, fitted.fresh_index
        replay = composed.select(torch.nonzero(composed.is_replay).flatten())
        n_replay = len(replay)

        # Algorithm 1 step 7: this step's fresh non-zero-variance rows join the buffer after the draw; a row whose
        # completion mask is empty (mask_truncated_completions) would train on nothing and is never stored.
        queued = torch.nonzero(nonzero_var & has_tokens).flatten()
        handle = self.replay_session.defer(fresh.select(queued), missing_logps=aligned)
        self._replay_handle = handle
        row_id = torch.full((n,), -1, dtype=torch.long)
        row_id[queued] = torch.arange(len(queued))
        if aligned:
            left_out = torch.ones(n, dtype=torch.bool)
            left_out[kept] = False
            left_out &= row_id >= 0
            # Displaced by pool composition or left out by the fit: not in the update, so a pass of their own.
            self._replay_displaced_logps(out, handle, row_id, torch.nonzero(left_out).flatten())
            if n_replay:  # placeholders for the fresh rows, replaced by the update's own detached log-probs
                out["old_per_token_logps"] = torch.zeros(out["completion_mask"].shape, device=device)

        if n_replay or len(kept) != n:
            out = merge_replay(self, out, kept, replay)
        out[REPLAY_FLAG_KEY] = torch.cat(
            [torch.zeros(len(kept), dtype=torch.bool), torch.ones(n_replay, dtype=torch.bool)]
        ).to(device)
        if aligned:
            out[ROW_ID_KEY] = torch.cat([row_id[kept], torch.full((n_replay,), -1, dtype=torch.long)]).to(device)
        mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
        out["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        handle.note = self._replay_log_step(composed, step, len(queued), n, int(nonzero_var.sum()), drift)
        return out

    def _replay_flush(self, log: bool, before_step: Optional[int] = None) -> None:
        """Insert the queued fresh rows (those born before `before_step`, default all) into the buffer: the
        session refuses rows the update never gave behaviour log-probs (ValueError). With `log`, every process must
        call it at the same point: the logged counts are gathered."""
        inserted = self.replay_session.flush(before=before_step)  # rows with NaN/inf log-probs stay out, counted
        skipped = self.replay_session.take_skipped_nonfinite()
        for handle in self.replay_session.flushed:
            if handle.note is not None:  # the generation's replay_history record
                handle.note.update(inserted=handle.n_inserted, buffer_size=len(self.replay_buffer))
        if log:
            tot = sum_over_processes(self.accelerator, {"inserted": inserted, "buffer_size": len(self.replay_buffer),
                                                        "skipped": skipped})
            row = step_row(inserted=tot["inserted"], buffer={mn.BUFFER_SIZE: tot["buffer_size"]},
                           skipped_nonfinite=tot["skipped"])
            for k, v in row.items():
                self._metrics["train"][k].append(v)

    def _replay_displaced_logps(self, out: dict[str, Any], handle: Deferred, row_id: torch.Tensor,
                                rows: torch.Tensor) -> None:
        """Behaviour log-probs of this process's displaced queued `rows`, into their deferred batch."""
        logps = collective_logps(self, {k: out[k][rows.to(out[k].device)] for k in FORWARD_KEYS})
        if logps is None:
            return
        handle.fill(row_id[rows], logps)

    # --- logging (through TRL's self._metrics, averaged per logging step by TRL) --------------------
    def _replay_log_step(self, composed: RolloutBatch, step: int, queued: int, n_fresh: int, n_ok: int,
                         drift: Optional[DriftCheck]) -> dict[str, Any]:
        """Log one generation's composition (`step_row` of the session's tally, merged over processes); returns
        its `replay_history` record (`ReplayRecord`), whose `inserted` and `buffer_size` are final once the step's rows enter the buffer
        (`_replay_flush`). The zero-variance share counts rows: TRL's groups are whole over the processes."""
        tally = self.replay_session.tally(composed, step, groups=n_fresh, zero_variance_groups=n_fresh - n_ok)
        if drift is not None:  # over every replay row drawn, the dropped ones included (they left the batch)
            tally.update(Tally.of_drift(drift.replay, drift.drift, drift.dropped))
        totals = self.replay_session.totals()
        totals.pop(mn.BUFFER_SIZE)  # logged when the rows enter the buffer
        merged = Tally.merge(gather_over_processes(self.accelerator, tally.flat()))
        metrics = self._metrics["train"]
        for k, v in step_row(merged).items():
            metrics[k].append(float(v))
        for k, v in step_row(buffer=sum_over_processes(self.accelerator, totals)).items():
            metrics[k].append(v)
        rep = composed.is_replay
        record = ReplayRecord.of(
            step=step, fresh_rows=len(composed) - int(rep.sum()), replay_rows=int(rep.sum()), inserted=queued,
            replay_birth_steps=composed.birth_step[rep].tolist(), replay_ages=composed.age(step)[rep].tolist(),
            replay_advantages=composed.advantages[rep].tolist(), fresh_advantages=composed.advantages[~rep].tolist(),
            replay_completion_ids=composed.completion_ids[rep].tolist())
        self.replay_history.append(record)
        return record

    def _replay_log_clip(self, inputs: dict[str, Any], logps: torch.Tensor, is_replay: torch.Tensor) -> None:
        """PPO-clip statistics split by fresh vs replay rows, from the log-probs TRL's loss just computed."""
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        mask = mask.float()
        log_ratio = logps - inputs.get("old_per_token_logps", logps)
        if self.importance_sampling_level == "sequence":
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1).expand_as(mask)
        ratio = torch.exp(log_ratio)
        adv = inputs["advantages"].unsqueeze(1)
        if self.loss_type == "cispo":
            clipped = (ratio > self.epsilon_high) & (adv > 0)
        else:
            clipped = ((ratio < 1 - self.epsilon_low) & (adv < 0)) | ((ratio > 1 + self.epsilon_high) & (adv > 0))
        tally = Tally()
        for kind, rows in zip(KINDS, (~is_replay, is_replay)):
            tally.add_clip(kind, ratio[rows], clipped[rows], mask[rows])
        merged = Tally.merge(gather_over_processes(self.accelerator, tally.flat()))
        metrics = self._metrics["train" if self.model.training else "eval"]
        for k, v in step_row(merged).items():
            metrics[k].append(float(v))


def _kept_after(checks: list, check: Optional[DriftCheck]) -> Optional[torch.Tensor]:
    """Record a generation's drift check; (R,) bool the replay rows it keeps (None: no bound)."""
    checks.append(check)
    return None if check is None else ~check.dropped
