"""What a ReplayGRPOTrainer checkpoint holds beyond TRL's own files and the replay buffer, and the cross-process
reductions the trainer logs with.

When one generation spans several optimizer steps (steps_per_generation x num_iterations > gradient accumulation
steps), a checkpoint can fall inside it. Plain GRPOTrainer then generates anew at the resume step, so the resumed
run trains on other rollouts and draws other replay rows than the uninterrupted run. The rest of the generation
(TRL's `_buffered_inputs`, fresh and replay rows as composed) and TRL's micro-step count are saved with the
checkpoint, one file per process, and restored: the resumed run continues that generation, and the same draws
follow.

TRL's `RepeatSampler` draws one permutation of the prompts per epoch from one generator; a resumed run builds a new
sampler whose first pass is the uninterrupted run's first epoch, so a resume in any later epoch went on with
another run's prompt order. `EpochAlignedSampler` first draws (and drops) the permutations of the epochs trained.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from trl.trainer.utils import RepeatSampler

GENERATION_FILE = "replay_generation_rank{rank}.pt"


def save_generation(trainer, folder: str) -> None:
    """Save the unfinished generation, if the checkpoint cuts one."""
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    if trainer._buffered_inputs is None or trainer._step % generate_every == 0:
        return  # the next micro-step generates anew in the uninterrupted run too
    chunks = [{k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in chunk.items()}
              for chunk in trainer._buffered_inputs]
    torch.save({"step": trainer._step, "chunks": chunks},
               os.path.join(folder, GENERATION_FILE.format(rank=trainer.accelerator.process_index)))


def load_generation(trainer, checkpoint: str) -> None:
    """Restore the generation a checkpoint cut (nothing when it cut none)."""
    path = os.path.join(checkpoint, GENERATION_FILE.format(rank=trainer.accelerator.process_index))
    state = torch.load(path, weights_only=True) if os.path.exists(path) else None
    usable = state is not None and len(state["chunks"]) == trainer.args.steps_per_generation
    # All processes or none: one continuing a generation while another generates would break TRL's collectives.
    agreed = gather_over_processes(trainer.accelerator, {"usable": float(usable), "saved": float(state is not None)})
    if not bool(agreed["saved"].any()):
        return
    if not bool(agreed["usable"].all()):
        warnings.warn(f"ReplayGRPOTrainer: {checkpoint} cut a generation, but not every process can continue it "
                      "(saved with other processes or another steps_per_generation); generating anew at the resume step.")
        return
    device = trainer.accelerator.device
    trainer._buffered_inputs = [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in chunk.items()}
                                for chunk in state["chunks"]]
    trainer._step = int(state["step"])  # TRL picks the chunk, and when to generate, by it


class EpochAlignedSampler(RepeatSampler):
    """TRL's RepeatSampler whose pass for epoch e is the e-th permutation of its generator, resumed or not."""

    def __init__(self, base: RepeatSampler, trainer) -> None:
        super().__init__(base.data_source, base.mini_repeat_count, base.batch_size, base.repeat_count, base.shuffle,
                         base.seed)
        self._trainer, self._passes = trainer, 0

    def __iter__(self):
        if self.shuffle:
            epoch = int(self._trainer.state.epoch or 0)  # the epoch starting: a resumed run's is the checkpoint's
            while self._passes < epoch:
                torch.randperm(self.num_samples, generator=self.generator)
                self._passes += 1
            self._passes += 1
        return super().__iter__()


def gather_over_processes(accelerator, values: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Each named scalar from every process, in one collective call: name -> (num_processes,) float64."""
    names = list(values)
    local = torch.stack([
        v.detach().to(accelerator.device, torch.float64) if isinstance(v, torch.Tensor)
        else torch.tensor(v, dtype=torch.float64, device=accelerator.device)  # a Python number: no float32 detour
        for v in (values[k] for k in names)
    ])
    gathered = accelerator.gather(local[None]).view(-1, len(names))
    return {k: gathered[:, i] for i, k in enumerate(names)}


def sum_over_processes(accelerator, values: dict[str, Any]) -> dict[str, float]:
    """Each named scalar summed over all processes (one collective call)."""
    return {k: float(v.sum()) for k, v in gather_over_processes(accelerator, values).items()}
