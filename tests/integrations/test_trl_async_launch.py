"""ReplayAsyncGRPOTrainer on 2 CPU processes (`accelerate launch`, gloo): the main process reads the rollout queue and
composes; TRL dispatches one packed row per process per micro-batch. A third of the prompts have no reward variance,
and TRL's planner puts a group in one row, so the processes' rows hold unequal numbers of zero-variance samples.

Also the worker script: `accelerate launch test_trl_async_launch.py --worker OUT_DIR`.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

if __name__ != "__main__":
    pytest.importorskip("trl")
    from trl_launch import launch_two

RUNS = {"paper": {}, "fill_filtered": {"replay_fill_filtered": True}}


def _worker(out_dir: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import torch

    from async_setup import make_async_trainer, params, reward_some_flat

    out = Path(out_dir)
    rank = int(os.environ["RANK"])
    records = {}
    for name, kw in RUNS.items():
        t = make_async_trainer(out / name, reward=reward_some_flat, max_steps=3, **kw)
        flat_rows = []
        step = t.training_step

        def counting_step(model, inputs, num_items_in_batch, step=step, flat_rows=flat_rows):
            keep = inputs["token_index"] >= 0
            seg, adv = inputs["segment_id"][keep], inputs["advantages"][keep]
            flat_rows.append(sum(int((adv[seg == i] == 0).all()) for i in torch.unique(seg)))
            return step(model, inputs, num_items_in_batch)

        t.training_step = counting_step
        t.train()
        records[name] = {"params": params(t.model).tolist(), "rows": list(t.replay_rows_per_process), "flat": flat_rows,
                         "history": [{"rows": h["fresh_rows"] + h["replay_rows"], "replay_rows": h["replay_rows"]}
                                     for h in t.replay_history]}
    (out / f"rank{rank}.json").write_text(json.dumps(records))


@pytest.mark.slow
def test_two_processes_uneven_filtering(tmp_path):
    from test_trl import make_model

    for name in RUNS:
        make_model(0).save_pretrained(tmp_path / name / "model")  # before the launch: no barrier of their own
    proc = launch_two(__file__, str(tmp_path), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r0, r1 = (json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2))
    for name in RUNS:
        a, b = r0[name], r1[name]
        assert a["params"] == b["params"], f"{name}: the processes hold different parameters"
        assert len(a["rows"]) == len(b["rows"]) == 6 and min(a["rows"] + b["rows"]) >= 1  # 2 micro-batches a step
        assert [h["rows"] for h in a["history"]] == [16, 16, 16]  # the main process composed 16 samples a step
        assert b["history"] == []  # only the main process reads the queue
        assert sum(h["replay_rows"] for h in a["history"]) > 0
    paper = r0["paper"]["flat"], r1["paper"]["flat"]
    assert paper[0] != paper[1], "filtering was not uneven between the processes"


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker(sys.argv[sys.argv.index("--worker") + 1])
