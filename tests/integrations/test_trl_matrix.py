"""ReplayGRPOTrainer option matrix: real `trainer.train()` runs on the tiny CPU Qwen2 of test_trl.py.

Factors: loss_type {grpo, bnpo, dr_grpo, dapo} x (steps_per_generation, gradient_accumulation_steps)
{(1,1), (2,2), (1,4), (4,2)} x num_iterations {1, 2} x mask_truncated_completions {off, on}. The full product is
64 runs; CELLS below is a covering sample (every value of every factor appears at least once) that also hits each
way TRL schedules generation: aligned with the optimizer step (TRL computes no old log-probs), several generations
per optimizer step, one generation spanning several optimizer steps, and the reuse of a generation
(num_iterations 2). Checked in every cell, on the batches the loss actually receives:
- no replay row is younger than one optimizer step, and none has an empty loss mask (nor does any stored row);
- replay rows carry the advantage and behaviour log-probs of their generation (the latter checked against a separate
  no-grad pass of the generating policy); every row queued for the buffer likewise;
- `replay/share` is the configured 1/3 whenever the buffer holds enough rows, and that happens;
- aligned cells run no forward pass besides the update's own; pad_to_multiple_of is honoured.
"""
from __future__ import annotations

import pytest

trl = pytest.importorskip("trl")
import torch  # noqa: E402

from test_trl import make_dataset, make_model, make_tokenizer, reward_fn, trl_kwargs  # noqa: E402
from grpo_replay.integrations.trl.fresh_rows import fresh_batch  # noqa: E402

# (loss_type, steps_per_generation, gradient_accumulation_steps, num_iterations, mask_truncated, max_steps, pad)
CELLS = [
    ("grpo", 1, 1, 1, False, 4, None),  # aligned: behaviour log-probs from the update's forward
    ("bnpo", 2, 2, 2, True, 6, None),  # a generation reused for two optimizer steps: TRL computes old log-probs
    ("dr_grpo", 1, 4, 1, True, 3, 4),  # four generations per optimizer step, aligned; widths padded to 4
    ("dapo", 4, 2, 1, False, 6, None),  # a generation spans two optimizer steps: TRL computes old log-probs
    ("dapo", 1, 4, 2, False, 3, None),  # aligned, each generation used twice in one accumulation window
]
RATIO = 0.5  # the paper preset's: replay share 1/3
TOL = 1e-5


def _key(prompt_ids, prompt_mask, completion_ids, loss_mask) -> tuple:
    n = int(torch.nonzero(loss_mask).max()) + 1 if bool(loss_mask.any()) else 0
    return tuple(prompt_ids[prompt_mask.bool()].tolist()), tuple(completion_ids[:n].tolist())


def _recording_trainer_cls():
    from grpo_replay.integrations.trl import ReplayGRPOTrainer
    from grpo_replay.integrations.trl.replay_forward import current_logps

    class Recording(ReplayGRPOTrainer):
        """Records what each generation produced, what the loss received and every extra forward pass."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.generated: dict[tuple, list] = {}  # row key -> [(advantage, reference log-probs)]
            self.loss_batches: list[dict] = []
            self.draws: list[tuple[int, int, int]] = []  # (step, requested replay rows, rows available)
            self.extra_passes = 0
            self.queued_checked = 0
            self._in_reference = False
            buf, sample = self.replay_buffer, self.replay_buffer.sample

            def checked_sample(n_rows, step):  # at every real draw, nothing in the buffer is born at that step
                births = buf.storage.col("birth_step")[buf.storage.valid_slots()]
                if n_rows and step >= buf.config.warmup_steps:
                    assert (births < step).all(), f"the buffer holds rows born at step {step} when it draws"
                return sample(n_rows, step)

            buf.sample = checked_sample

        def _get_per_token_logps_and_entropies(self, *a, **kw):
            if not kw.get("compute_entropy") and not self._in_reference:
                self.extra_passes += 1
            return super()._get_per_token_logps_and_entropies(*a, **kw)

        def _replay_compose(self, out, rewards_per_func):
            self._in_reference = True
            try:  # the generating policy's log-probs, by a pass of the test's own
                ref = current_logps(self, out).float().cpu()
            finally:
                self._in_reference = False
            mask = out["completion_mask"].cpu()
            prompt_ids, prompt_mask = out["prompt_ids"].cpu(), out["prompt_mask"].cpu()
            completion_ids = out["completion_ids"].cpu()
            for i in range(len(mask)):
                key = _key(prompt_ids[i], prompt_mask[i], completion_ids[i], mask[i])
                self.generated.setdefault(key, []).append((float(out["advantages"][i]), ref[i][mask[i].bool()]))
            step = int(self.state.global_step)
            self.replay_buffer.evict(step)  # what compose_batch does first: the rows then available
            self.draws.append((step, round(RATIO * len(mask)), len(self.replay_buffer)))
            _, nonzero_var, has_tokens = fresh_batch(self, out, rewards_per_func, step)  # the rows the trainer queues
            result = super()._replay_compose(out, rewards_per_func)
            self._replay_handle.test_ref = ref[torch.nonzero(nonzero_var & has_tokens).flatten()]
            return result

        def _replay_flush(self, log, before_step=None):
            for handle in self.replay_session.waiting():
                if before_step is None or int(handle.rows.birth_step[0]) < before_step:
                    b = handle.rows
                    m = b.completion_mask.bool()
                    assert torch.allclose(b.behaviour_logps[m], handle.test_ref[m], atol=TOL), "stored log-probs"
                    self.queued_checked += len(b)
            return super()._replay_flush(log, before_step)

        def _compute_loss(self, model, inputs):
            rec = {k: (v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
            rec["step"] = int(self.state.global_step)
            self.loss_batches.append(rec)
            return super()._compute_loss(model, inputs)

    return Recording


@pytest.mark.parametrize("loss_type,spg,ga,iters,mask_trunc,max_steps,pad", CELLS)
def test_option_matrix(tmp_path, loss_type, spg, ga, iters, mask_trunc, max_steps, pad):
    from grpo_replay.integrations.trl import ReplayGRPOConfig
    from grpo_replay.integrations.trl.replay_grpo_trainer import REPLAY_FLAG_KEY

    kwargs = trl_kwargs(
        tmp_path, replay_preset="paper", replay_ratio=RATIO, loss_type=loss_type, steps_per_generation=spg,
        gradient_accumulation_steps=ga, num_iterations=iters, mask_truncated_completions=mask_trunc,
        max_steps=max_steps, pad_to_multiple_of=pad, max_completion_length=8, learning_rate=3e-2,
    )
    trainer = _recording_trainer_cls()(
        model=make_model(0), reward_funcs=reward_fn, args=ReplayGRPOConfig(**kwargs),
        train_dataset=make_dataset(), processing_class=make_tokenizer(),
    )
    before = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
    trainer.train()
    after = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    assert not torch.equal(before, after) and torch.isfinite(after).all()
    hist = list(trainer.replay_history)
    aligned = ga % (spg * iters) == 0

    # No replay row born at the step that replays it.
    assert all(b < h["step"] for h in hist for b in h["replay_birth_steps"]), hist

    # Stored rows all have a completion token; queued rows were checked against the reference pass at insertion.
    buf = trainer.replay_buffer
    stored = buf.gather(buf.storage.valid_slots())
    assert len(stored) > 0 and bool((stored.completion_mask.sum(1) > 0).all())
    assert trainer.queued_checked == sum(h["inserted"] for h in hist) > 0

    # What the loss received: replay rows frozen at generation, non-empty, widths honouring pad_to_multiple_of.
    n_replay_seen = 0
    for rec in trainer.loss_batches:
        mask = rec["completion_mask"] * rec.get("tool_mask", 1)
        if pad:
            assert rec["prompt_ids"].shape[1] % pad == 0 and rec["completion_ids"].shape[1] % pad == 0
        for i in torch.nonzero(rec[REPLAY_FLAG_KEY]).flatten().tolist():
            assert mask[i].sum() > 0, "replay row with an empty loss mask"
            key = _key(rec["prompt_ids"][i], rec["prompt_mask"][i], rec["completion_ids"][i], mask[i])
            old = rec["old_per_token_logps"][i][mask[i].bool()].float()
            matches = [
                (a, ref) for a, ref in trainer.generated.get(key, [])
                if a == float(rec["advantages"][i]) and ref.shape == old.shape and torch.allclose(ref, old, atol=TOL)
            ]
            assert matches, f"replay row {key} does not carry its generation's advantage and log-probs"
            n_replay_seen += 1
    assert n_replay_seen > 0

    # Replay share: exactly the configured 1/3 whenever the buffer could supply the requested rows.
    warm = 0
    for (step, want, available), h in zip(trainer.draws, hist):
        if step >= 1 and available >= want:  # warm-up is 1 step (trl_kwargs)
            assert h["replay_rows"] == want and h["fresh_rows"] == 2 * want, (step, h)
            warm += 1
    assert warm >= 1, trainer.draws
    warm_steps = {s for s, w, a in trainer.draws if s >= 1} - {s for s, w, a in trainer.draws if a < w}
    logged = {row["step"] - 1: row["replay/share"] for row in trainer.state.log_history if "replay/share" in row}
    assert any(s in logged for s in warm_steps)
    assert all(logged[s] == pytest.approx(1 / 3) for s in warm_steps if s in logged), logged

    # Behaviour log-probs: aligned cells run no forward pass besides the update's (the test's own is not counted).
    if aligned:
        assert trainer.extra_passes == 0
    else:
        assert trainer.extra_passes == len(hist)  # TRL's old_per_token_logps, once per generation
