"""replay.max_drift in ReplayAsyncGRPOTrainer on 2 CPU processes (`accelerate launch`, gloo), through real
`AsyncGRPOTrainer.train()`: each process measures the drift of the replayed samples in its own packed rows on TRL's
loss forward; a tight bound takes them out of that process's loss terms, out of TRL's token normaliser on every
process (all-reduced), and the main process (which holds the buffer and logs) counts and evicts those of both.

Each process records the two calls `bounded_loss` makes to TRL's `compute_loss` per micro-batch (the forward's
inputs, then the loss's), so the test reads what TRL's loss was actually given on each rank.

Also the worker script: `accelerate launch test_trl_async_max_drift_launch.py --worker OUT_DIR`.
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

STEPS = 4
TIGHT = 1e-12


def _worker(out_dir: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer

    from async_setup import make_async_trainer
    from grpo_replay.integrations.trl.async_drift import SEQ_KEY

    out = Path(out_dir)
    rank = int(os.environ["RANK"])
    calls = []
    trl_loss = AsyncGRPOTrainer.compute_loss

    def recording_loss(self, model, inputs, *args, **kwargs):
        calls.append({"step": int(self.state.global_step), "seqs": inputs[SEQ_KEY].reshape(-1).tolist(),
                      **{k: inputs[k].reshape(-1).tolist() for k in ("token_index", "segment_id", "advantages")},
                      "global_n_tokens": float(inputs["global_n_tokens"][0])})
        return trl_loss(self, model, inputs, *args, **kwargs)

    AsyncGRPOTrainer.compute_loss = recording_loss  # what `super().compute_loss` in bounded_loss resolves to
    t = make_async_trainer(out, max_steps=STEPS, replay_max_drift=TIGHT)
    t.train()
    record = {"calls": calls}
    if t.replay_composer is not None:
        record["logs"] = [row for row in t.state.log_history if "loss" in row]
        record["history"] = [{"replay_rows": h["replay_rows"],
                              "replayed": [int(s["replay_buffer_seq"]) for s in h["samples"] if s["replay_is_replay"]]}
                             for h in t.replay_history]
        record["evicted_drift"] = int(t.replay_composer.buffer.total_evicted_drift)
    (out / f"rank{rank}.json").write_text(json.dumps(record))


def _micro_batches(calls: list[dict]) -> list[dict]:
    """Per micro-batch of one process: its replayed samples, the loss tokens left out, whether a fresh sample's tokens
    changed, and the normaliser before and after."""
    assert len(calls) % 2 == 0, "bounded_loss calls TRL's compute_loss twice per micro-batch"
    out = []
    for first, second in zip(calls[::2], calls[1::2]):
        selected = [i for i, x in enumerate(first["token_index"]) if x >= 0]
        kinds = {}  # segment -> its buffer insertion number (-1: fresh)
        left_tokens = fresh_changed = replay_kept = 0
        for i in selected:
            seq = first["seqs"][first["segment_id"][i]]
            kinds[first["segment_id"][i]] = seq
            same = (second["token_index"][i] == first["token_index"][i]
                    and second["advantages"][i] == first["advantages"][i])
            # Left out: its token dropped from the loss (token_index -1), or, when every token of the row leaves,
            # kept at advantage 0 (no gradient).
            left = second["token_index"][i] < 0 or (second["advantages"][i] == 0 != first["advantages"][i])
            if seq < 0:
                fresh_changed += not same
            else:
                left_tokens += left
                replay_kept += not left
        out.append({"step": first["step"], "replayed": sorted(s for s in kinds.values() if s >= 0),
                    "fresh": sum(s < 0 for s in kinds.values()), "left_tokens": left_tokens,
                    "fresh_changed": fresh_changed, "replay_kept": replay_kept,
                    "n_tokens": (first["global_n_tokens"], second["global_n_tokens"])})
    return out


@pytest.mark.slow
def test_two_processes_tight_bound_drops_replayed_samples_on_every_rank(tmp_path):
    from test_trl import make_model

    make_model(0).save_pretrained(tmp_path / "model")  # before the launch: the workers have no barrier of their own
    proc = launch_two(__file__, str(tmp_path), timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r0, r1 = (json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2))
    mb0, mb1 = _micro_batches(r0["calls"]), _micro_batches(r1["calls"])
    assert len(mb0) == len(mb1) == 2 * STEPS  # gradient_accumulation_steps=2

    for rank, mbs in enumerate((mb0, mb1)):
        assert sum(len(m["replayed"]) for m in mbs) > 0, f"rank {rank} trained on no replayed sample"
        assert sum(m["fresh"] for m in mbs) > 0
        assert all(m["fresh_changed"] == 0 for m in mbs), f"rank {rank} left a fresh sample's tokens out"
        assert all(m["replay_kept"] == 0 for m in mbs), f"rank {rank} kept a replayed sample above the bound"
    for a, b in zip(mb0, mb1):  # TRL's normaliser, all-reduced: both ranks' left-out tokens leave it on each rank
        assert a["n_tokens"] == b["n_tokens"]
        assert a["n_tokens"][0] - a["n_tokens"][1] == a["left_tokens"] + b["left_tokens"]

    # The main process logs the counts over both ranks (one row a step) and evicts each dropped sample once.
    per_step = {}
    for m in mb0 + mb1:
        per_step.setdefault(m["step"], []).extend(m["replayed"])
    dropped = [len(per_step[s]) for s in sorted(per_step)]
    logs, history = r0["logs"], r0["history"]
    assert [row["replay/drift_dropped"] for row in logs] == dropped
    assert [h["replay_rows"] for h in history] == dropped  # every replayed sample of the step, none fresh
    distinct = {seq for seqs in per_step.values() for seq in seqs}
    assert r0["evicted_drift"] == logs[-1]["buffer/evicted_drift"] == len(distinct) > 0
    assert distinct == {seq for h in history for seq in h["replayed"]}
    assert "logs" not in r1  # only the main process holds the buffer and logs the replay metrics


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker(sys.argv[sys.argv.index("--worker") + 1])
