"""Resuming ReplayGRPOTrainer from a checkpoint that falls inside a generation (one generation spans two optimizer
steps): the resumed run continues that generation, so the same rollouts, draws, losses and parameters follow as in
the uninterrupted run."""
from __future__ import annotations

import pytest

trl = pytest.importorskip("trl")
import torch  # noqa: E402

from test_trl import _logged, _param_vector, make_trainer  # noqa: E402

KW = dict(replay_preset="paper", steps_per_generation=4, gradient_accumulation_steps=2, max_steps=4,
          save_strategy="steps", save_steps=1, replay_tau_max=5)


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    trainer = make_trainer(out, **KW)
    trainer.train()
    return out, trainer


@pytest.mark.parametrize("resume_step", [1, 2, 3])
def test_resume_inside_a_generation_continues_it(full, tmp_path, resume_step):
    from grpo_replay.integrations.trl.resume import GENERATION_FILE

    out, trainer = full
    ckpt = out / f"checkpoint-{resume_step}"
    hist = list(trainer.replay_history)
    assert [h["step"] for h in hist] == [0, 2] and hist[1]["replay_rows"] > 0

    resumed = make_trainer(tmp_path, **KW)
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert list(resumed.replay_history) == [h for h in hist if h["step"] >= resume_step]
    assert _logged(resumed, "loss") == _logged(trainer, "loss")  # the resumed log starts with the checkpoint's
    assert torch.equal(_param_vector(resumed.model), _param_vector(trainer.model))
    cuts = resume_step % 2 == 1  # generations start at steps 0 and 2
    assert (ckpt / GENERATION_FILE.format(rank=0)).exists() == cuts  # saved only where a generation is cut
