"""ReplayGRPOTrainer and transformers' accumulation windows: the last window of an epoch holds only
`steps_in_epoch % gradient_accumulation_steps` micro-steps. Fresh rows enter the buffer at the real end of every
window, so no step ever replays a row born at that step: across short windows, several epochs and a resume.
"""
from __future__ import annotations

import pytest

trl = pytest.importorskip("trl")
import torch  # noqa: E402
from test_trl import make_dataset, make_model, make_tokenizer, reward_fn, trl_kwargs  # noqa: E402


def _window_trainer(out, n_prompts: int, **kw):
    from grpo_replay.integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer

    class Checked(ReplayGRPOTrainer):
        """Records, at every draw, the birth steps of what the buffer holds, and the rows queued at each window end."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.draw_births: list[tuple[int, list[int]]] = []
            self.pending_at_sync: list[int] = []
            _record_draws(self)

        def training_step(self, model, inputs, num_items_in_batch):
            out = super().training_step(model, inputs, num_items_in_batch)
            if self.accelerator.sync_gradients:
                self.pending_at_sync.append(len(self.replay_session.waiting()))
            return out

        def _load_optimizer_and_scheduler(self, checkpoint):
            super()._load_optimizer_and_scheduler(checkpoint)
            _record_draws(self)  # the restored buffer is a new object

    args = ReplayGRPOConfig(**trl_kwargs(out, **kw))
    return Checked(model=make_model(0), reward_funcs=reward_fn, args=args, train_dataset=make_dataset(n_prompts),
                   processing_class=make_tokenizer())


def _record_draws(trainer) -> None:
    buf, sample = trainer.replay_buffer, trainer.replay_buffer.sample

    def recording_sample(n_rows, step):
        births = buf.storage.col("birth_step")[buf.storage.valid_slots()]
        trainer.draw_births.append((int(step), [int(b) for b in births]))
        return sample(n_rows, step)

    buf.sample = recording_sample


def _no_age_zero(trainer) -> None:
    hist = list(trainer.replay_history)
    assert all(b < h["step"] for h in hist for b in h["replay_birth_steps"]), [
        (h["step"], h["replay_birth_steps"]) for h in hist]
    for step, births in trainer.draw_births:
        assert all(b < step for b in births), f"the buffer holds rows born at step {step} when it draws: {births}"
    assert trainer.pending_at_sync and all(p == 0 for p in trainer.pending_at_sync), trainer.pending_at_sync


def test_short_window_never_replays_age_zero(tmp_path):
    # 6 prompts, one per micro-step: epochs of 6 micro-steps in windows of 4 and 2. tau_max=0 evicts every row
    # older than its step, so only a row born at the step itself could ever be drawn.
    kw = dict(per_device_train_batch_size=4, num_generations=4, steps_per_generation=1, gradient_accumulation_steps=4,
              max_steps=4, replay_preset="paper", replay_tau_max=0)
    trainer = _window_trainer(tmp_path, 6, **kw)
    trainer.train()
    _no_age_zero(trainer)
    assert sum(h["replay_rows"] for h in trainer.replay_history) == 0
    assert len(trainer.pending_at_sync) == 4  # one window end per optimizer step, short windows included
    # Several generations share an optimizer step (and birth step): each record counts the rows of its own.
    hist = list(trainer.replay_history)
    assert len({h["step"] for h in hist}) < len(hist)
    assert sum(h["inserted"] for h in hist) == trainer.replay_buffer.total_added > 0


def test_short_windows_several_epochs_and_resume(tmp_path):
    # 3 epochs of windows 4 + 2; a checkpoint at step 3 sits mid-epoch, before a short window.
    kw = dict(per_device_train_batch_size=4, num_generations=4, steps_per_generation=1, gradient_accumulation_steps=4,
              max_steps=6, replay_preset="paper", replay_tau_max=5, save_strategy="steps", save_steps=3)
    full = _window_trainer(tmp_path / "full", 6, **kw)
    full.train()
    _no_age_zero(full)
    hist = list(full.replay_history)
    assert sum(h["replay_rows"] for h in hist) > 0, "nothing was replayed: the test would prove nothing"
    assert len(full.pending_at_sync) == 6

    resumed = _window_trainer(tmp_path / "resumed", 6, **kw)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    _no_age_zero(resumed)
    assert sum(h["replay_rows"] for h in resumed.replay_history) > 0
    assert len(resumed.pending_at_sync) == 3
    # Resumed in epoch 1, it goes on with the same prompt order, rollouts and draws as the uninterrupted run.
    assert list(resumed.replay_history) == [h for h in hist if h["step"] >= 3]
    assert torch.equal(_params(resumed.model), _params(full.model))


def _params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])
