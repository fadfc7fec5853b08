"""`AsyncComposer`: the replay step of `ReplayAsyncGRPOTrainer`, between TRL's `RolloutQueueDataset` (fresh samples,
stale ones already dropped) and its planner (`FixedCountBatcher` / `TokenBudgetBatcher`), on the main process.

It hands the planner the samples of one optimizer step at a time, a chunk of S = per_device_train_batch_size x
num_processes x gradient_accumulation_steps samples (what TRL's fixed-count planner packs into one step), composed by
the core's `compose_batch` from fresh samples and rows of one `ReplayBuffer`:

- fresh_anchored: n = round(S / (1 + replay_ratio)) fresh samples and round(replay_ratio x n) replay rows within the
  S - n the step leaves, missing ones (warm-up, a short buffer) made up with more fresh samples, so the step keeps
  TRL's size and every fresh sample taken from the queue is trained on;
- pool: S fresh samples, of which replay rows displace some (stored, not trained, as the core's pool does);
- fill_filtered: S fresh samples; each zero-variance one (whose group's rewards are all equal: A = 0) is replaced by a
  replay row while the buffer has one, so the update keeps its size and no more is generated.
The counts are the core's step plan for a fixed total (`step_plan`, `Unit(total=S)`: never zero replay rows while
the step has room for one); a composition without a rule for a fixed total is refused by name (`check_chunk`).

The planner then packs the chunk as it packs fresh samples (TRL's own row balancing and token budget), so every process
gets one non-empty row per micro-batch and the same number of micro-batches per step. Under a token budget the number
of samples per step is the planner's: a chunk keeps the replay share but need not coincide with one optimizer step.

Ages are in model versions, TRL's unit for staleness (`max_staleness`): a fresh sample is born at the version that
generated it (the queue's stamp); a sample enters the buffer once it has been trained on and the version has moved
past its birth, so a replayed row is never of age 0; the buffer evicts rows older than the effective bound
min(tau_max, max_staleness) before every draw. Ages are measured when a chunk is composed, which is where TRL measures
staleness (the dataloader works one micro-batch ahead of the update).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Callable, Iterator, Optional

import torch

from ...buffer import ReplayBuffer
from ...config import ReplayConfig
from ...errors import ConfigError
from ...session import ReplaySession
from ...step_plan import StepPlan, Unit, fixed_fresh, plan_step
from .async_samples import AGE, IS_REPLAY, SERIAL, from_batch, loss_span, sample_from_state, sample_state, to_batch, zero_variance


class AsyncComposer:
    """The session and what is in flight around it. `version()` reads the trainer's current model version.

    State (all saved by `state_dict`): the session (its buffer, and the fresh samples trained on and waiting for
    the version to move past their birth); `untrained`, samples composed and not yet trained on (the dataloader runs
    ahead of the update), in order; `chunk` and `serial` counters. A restored composer hands its `untrained` samples
    over again first, so the planner packs the same micro-batches as the run that saved it."""

    def __init__(self, config: ReplayConfig, max_staleness: int, chunk_size: int, seed: int,
                 version: Callable[[], int], group_size: int = 1):
        self.config = config
        self.chunk_size = chunk_size
        self.group_size = group_size
        self.plan = check_chunk(config, chunk_size, group_size)
        # Ages in model versions, bounded by min(tau_max, max_staleness); warm-up counts optimizer steps (chunks),
        # checked here, so the buffer itself has none. TRL's group ids are unique over the run.
        self.session = ReplaySession(config, seed=seed, engine_age_bound=max_staleness, global_groups=True,
                                     warmup_steps=0)
        self.age_bound = self.session.age_bound
        self.version = version
        self.untrained: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self.queued: deque[dict[str, Any]] = deque()  # composed, not yet handed to the planner (the tail of untrained)
        self.chunk = 0
        self.serial = 0
        self.history: deque[dict[str, Any]] = deque(maxlen=10_000)  # one record per chunk, for diagnostics and tests

    # --- the stream -----------------------------------------------------------------------------------
    def stream(self, fresh: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Samples for the planner, chunk after chunk (restored ones first)."""
        while True:
            if not self.queued:
                for sample in self._compose_chunk(fresh):
                    sample[SERIAL] = self.serial
                    self.serial += 1
                    self.untrained[sample[SERIAL]] = sample
                    self.queued.append(sample)
            yield self.queued.popleft()

    def _compose_chunk(self, fresh: Iterator[dict[str, Any]]) -> list[dict[str, Any]]:
        cfg, S, version = self.config, self.chunk_size, int(self.version())
        inserted = self.session.flush(before=version)  # the samples born before this version
        buffer_size = len(self.buffer)  # before this chunk's draw (it may evict)
        drawing = cfg.enabled and self.chunk >= cfg.warmup_steps
        anchored = cfg.composition == "fresh_anchored" and not cfg.fill_filtered
        n = self.plan.fresh if drawing else S
        taken = [_fresh(next(fresh)) for _ in range(n)]
        kept, replay, displaced = list(taken), [], []
        scorable = [i for i, s in enumerate(taken) if _has_loss_token(s)]
        if drawing and scorable:
            nz = [zero_variance(taken[i]) for i in scorable]
            batch = to_batch([taken[i] for i in scorable], step=version)
            group_of = self._stored_group_ids()  # before the draw: with max_uses it removes rows it hands out
            # the samples without a loss token are trained but not composed: the total the composition fills
            room = Unit(total=S - (n - len(scorable)))
            composed, keep, _ = self.session.compose(batch, version, n_filtered=sum(nz), unit=room,
                                                     group_size=self.group_size)
            rows = composed.select(torch.nonzero(composed.is_replay).flatten())
            groups = [group_of[q] for q in rows.buffer_seq.tolist()] if len(rows) else []
            replay = from_batch(rows, groups, (version - rows.birth_step).tolist())
            if cfg.fill_filtered:  # replay rows take the places of zero-variance samples
                gone = {scorable[i] for i, z in enumerate(nz) if z}
                gone = set(sorted(gone)[: len(replay)])
            elif not anchored:  # pool: the displaced samples are stored, not trained on
                gone = set(scorable) - {scorable[i] for i in keep.tolist()}
                displaced = [taken[i] for i in sorted(gone)]
            else:
                gone = set()
            kept = [s for i, s in enumerate(taken) if i not in gone]
        extra = S - len(kept) - len(replay) if anchored else 0  # warm-up or a short buffer: the step keeps its size
        kept += [_fresh(next(fresh)) for _ in range(max(extra, 0))]
        self._defer([s for s in displaced if _storable(s)])
        self.history.append({
            "chunk": self.chunk, "version": version, "fresh": len(kept), "replay": len(replay),
            "fresh_taken": len(taken) + max(extra, 0), "zero_variance_taken": sum(map(zero_variance, taken)),
            "inserted": inserted, "buffer_size": buffer_size,
            "replay_ages": [s[AGE] for s in replay],
        })
        self.chunk += 1
        return _interleave(kept, replay)

    @property
    def buffer(self) -> ReplayBuffer:
        return self.session.buffer

    def _defer(self, samples: list[dict[str, Any]]) -> None:
        """Fresh samples to the session's waiting rows, each born at its model version, named by its TRL group."""
        if samples:
            self.session.defer(to_batch(samples), prompt_keys=[int(s["group_id"]) for s in samples])

    def _stored_group_ids(self) -> dict[int, int]:
        """Insertion number -> the TRL group id each stored row was added with (kept by the buffer as its prompt
        key), so a replayed sample counts toward the prompt group TRL already trained."""
        seqs, prompt_keys = self.buffer.keys()
        return dict(zip(seqs.tolist(), prompt_keys.tolist()))

    def take_inserted(self) -> int:
        return self.session.take_inserted()

    # --- what the update consumed ---------------------------------------------------------------------
    def trained(self, serials: list[int]) -> list[dict[str, Any]]:
        """Mark one micro-batch's samples trained on; the storable fresh ones wait in `pending`. Returns them all."""
        out = [self.untrained.pop(s) for s in serials if s in self.untrained]
        self._defer([s for s in out if not s.get(IS_REPLAY) and _storable(s)])
        return out

    # --- checkpointing --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything but the buffer (saved on its own, `ReplaySession.save`)."""
        return {"pending_rows": self.session.pending_state(),
                "untrained": [sample_state(s) for s in self.untrained.values()],
                "chunk": self.chunk, "serial": self.serial}

    def load_state_dict(self, state: dict[str, Any], buffer_path: str) -> None:
        self.session.load(buffer_path)
        if "pending_rows" in state:
            self.session.load_pending(state["pending_rows"])
        else:  # saved before the session kept the waiting rows: they were samples
            self._defer([sample_from_state(s) for s in state["pending"]])
        self.queued = deque(sample_from_state(s) for s in state["untrained"])
        self.untrained = OrderedDict((s[SERIAL], s) for s in self.queued)
        self.chunk, self.serial = int(state["chunk"]), int(state["serial"])


def _fresh(sample: dict[str, Any]) -> dict[str, Any]:
    sample[IS_REPLAY] = False
    sample[AGE] = 0
    return sample


def _has_loss_token(sample: dict[str, Any]) -> bool:
    return loss_span(sample)[0] < len(sample["input_ids"])


def _storable(sample: dict[str, Any]) -> bool:
    """A fresh sample enters the buffer when its group has reward variance and it has a loss token."""
    return not zero_variance(sample) and _has_loss_token(sample)


def _interleave(fresh: list, replay: list) -> list:
    """Both lists merged with the replay rows spread evenly (each keeps its order), so every micro-batch of the
    step gets about the step's share."""
    keys = [(i + 0.5) / len(fresh) for i in range(len(fresh))] + [(j + 0.5) / len(replay) for j in range(len(replay))]
    order = sorted(range(len(keys)), key=lambda k: (keys[k], k >= len(fresh)))
    both = fresh + replay
    return [both[k] for k in order]


def chunk_size(args: Any, num_processes: int) -> int:
    """S, the samples of one composed chunk: `args.per_device_train_batch_size` x `num_processes` x
    `args.gradient_accumulation_steps` (what TRL's fixed-count planner packs into one step). The trainer sizes its
    composer with it and the preflight reports it, so the two cannot differ."""
    return (int(args.per_device_train_batch_size) * int(num_processes)
            * int(args.gradient_accumulation_steps))


def chunk_holds(config: ReplayConfig, plan: StepPlan) -> str:
    """What a step of `check_chunk`'s `plan` holds with a full buffer, in words (the trainer logs it, the preflight
    prints it)."""
    S = plan.total
    if config.enabled and config.fill_filtered:
        return (f"{S} samples per optimizer step: {plan.fresh} fresh, of which up to {plan.replay} (every "
                "zero-variance one) replaced by replay rows (replay_fill_filtered; the number is known only at run "
                "time)")
    return (f"{S} samples per optimizer step: {plan.kept} fresh + {plan.replay} replay (share "
            f"{plan.replay / S:.3f} vs configured {plan.configured:.3f}, the composer trims trailing replay rows "
            "to keep TRL's step size)")


def check_chunk(config: ReplayConfig, chunk_size: int, group_size: int = 1) -> StepPlan:
    """The step plan of a chunk of `chunk_size` samples with a full buffer; ConfigError naming the fields where the
    composition has no rule for a fixed-size step or where no replay row would train (replay on)."""
    plan = plan_step(fixed_fresh(config, chunk_size, group_size), config, Unit(total=chunk_size),
                     group_size=group_size)
    if plan.vanishes:
        raise ConfigError(
            f"ReplayAsyncGRPOTrainer: per_device_train_batch_size x num_processes x gradient_accumulation_steps = "
            f"{chunk_size} samples a step with replay_ratio={config.replay_ratio} ({config.composition}) would "
            f"train no replay row ({plan.fresh} fresh, {plan.planned} replay planned): the replay arm would be GRPO; "
            "allowed: more samples a step (a larger per_device_train_batch_size or gradient_accumulation_steps), "
            "or a larger replay_ratio")
    return plan
