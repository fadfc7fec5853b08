"""A fresh row whose behaviour log-probs are NaN or inf at a counted token cannot be replayed: the built-in trainer
leaves it out of the buffer insert and counts it (`buffer/skipped_nonfinite_logps`), so every checkpoint loads."""
import math

import grpo_replay.trainer.loop as loop
from grpo_replay import ReplayBuffer
from grpo_replay.trainer import checkpoint
from grpo_replay.trainer.train_config import resolve
from helpers import read_jsonl


def test_rows_with_nonfinite_logps_stay_out_of_the_buffer_and_are_counted(tiny_overrides, tmp_path, monkeypatch):
    real = loop._update

    def one_bad_row(*args, **kwargs):
        stats = real(*args, **kwargs)
        if stats["finite"] and len(stats["fresh_logps"]):
            stats["fresh_logps"][0, 0] = -math.inf  # what a sampler's log-prob under top-p can be
        return stats

    monkeypatch.setattr(loop, "_update", one_bad_row)
    out = tmp_path / "run"
    cfg = resolve({**tiny_overrides, "out_dir": str(out), "steps": 3, "checkpoint_every": 1, "eval_every": 0})
    loop.train(cfg)
    rows = read_jsonl(out / "metrics.jsonl")
    inserted = [r for r in rows if r["loss"] is not None and not r["skipped_nonfinite"]]
    assert inserted and all(r["buffer/skipped_nonfinite_logps"] == 1 for r in inserted)
    buf = ReplayBuffer.load(checkpoint.latest(out) / "buffer", cfg.replay)  # loads: nothing non-finite stored
    assert len(buf) > 0 and buf.total_added == sum(r["fresh/count"] - 1 for r in inserted)
