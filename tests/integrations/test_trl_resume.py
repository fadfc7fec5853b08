"""Resuming ReplayGRPOTrainer from a checkpoint that falls inside a generation (one generation spans two optimizer
steps): the resumed run continues that generation, so the same rollouts, draws, losses and parameters follow as in
the uninterrupted run."""
from __future__ import annotations

import sys

import pytest

trl = pytest.importorskip("trl") if __name__ != "__main__" else __import__("trl")
import torch  # noqa: E402

if __name__ == "__main__":
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
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


def test_resume_with_more_processes_generates_anew(full, tmp_path):
    """A cut generation saved by 1 process, resumed by 2: process 1 has nothing to continue, so neither continues
    (one generating while the other does not would break TRL's collectives), with a warning, and no hang."""
    import json

    from trl_launch import launch_two

    out, _ = full
    proc = launch_two(__file__, str(out / "checkpoint-1"), str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "not every process can continue it" in proc.stderr
    for rank in range(2):
        steps = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert steps[0] == 1, steps  # generated at the resume step


if __name__ == "__main__" and "--worker" in sys.argv:
    import json
    import os

    ckpt, out_dir = sys.argv[sys.argv.index("--worker") + 1:][:2]
    trainer = make_trainer(Path(out_dir) / "run", **{**KW, "save_strategy": "no"})
    trainer.train(resume_from_checkpoint=ckpt)
    Path(out_dir, f"rank{os.environ['RANK']}.json").write_text(json.dumps([h["step"] for h in trainer.replay_history]))
