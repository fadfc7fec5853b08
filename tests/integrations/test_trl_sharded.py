"""ReplayGRPOTrainer with its policy sharded by FSDP2 (`fully_shard`) on 2 CPU processes (gloo).

Accelerate on CPU ignores an FSDP plugin (MULTI_CPU + DistributedDataParallel), so the policy is sharded the way
transformers does it itself: `from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=2))` applies
`fully_shard` at load time (DTensor parameters), and transformers' Trainer then leaves the model unwrapped. Every
forward is then a collective: a process that runs one the others skip hangs them all. Process 1's groups have zero
variance at one step, so it displaces no fresh rows of its own then (pool presets) while process 0 does.

Also the worker script: `accelerate launch test_trl_sharded.py --worker OUT_DIR`.
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

PRESETS = ("paper", "grpo", "uniform_pool", "sigma_pool")
UNEVEN_STEP = 1  # process 1 scores every completion 1.0 at this step: no variance, nothing queued, nothing displaced


def _worker(out_dir: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    from grpo_replay.integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer
    from test_trl import make_dataset, make_tokenizer, reward_fn, trl_kwargs

    out = Path(out_dir)
    rank = int(os.environ["RANK"])  # torchrun's; accelerate's state is set up by the trainer only

    def reward_uneven(completions, trainer_state, **kwargs):
        if rank == 1 and trainer_state.global_step == UNEVEN_STEP:
            return [1.0] * len(completions)
        return reward_fn(completions)

    records = {}
    for preset in PRESETS:
        model = AutoModelForCausalLM.from_pretrained(out / "model", distributed_config=DistributedConfig(fsdp_size=2))
        assert model.is_distributed_loading_by_transformers
        assert all(type(p).__name__ == "DTensor" for p in model.parameters()), "the policy is not sharded"
        # Two groups per process; ratio 1 in a pool: one whole group of replay rows displaces one fresh group.
        ratio = {"replay_ratio": 1.0} if "pool" in preset else {}
        args = ReplayGRPOConfig(**trl_kwargs(out / preset, replay_preset=preset, per_device_train_batch_size=8,
                                             max_steps=4, **ratio))
        trainer = ReplayGRPOTrainer(model=model, reward_funcs=[reward_uneven], args=args,
                                    train_dataset=make_dataset(), processing_class=make_tokenizer())
        trainer.train()
        params = torch.cat([p.full_tensor().flatten() for p in trainer.model.parameters()])  # a collective
        records[preset] = {
            "history": [{k: h[k] for k in ("step", "fresh_rows", "replay_rows", "inserted", "replay_birth_steps")}
                        for h in trainer.replay_history],
            "params": params.tolist(),
            "finite": bool(torch.isfinite(params).all()),
            "buffer": len(trainer.replay_buffer),
        }
    (out / f"rank{rank}.json").write_text(json.dumps(records))


@pytest.mark.slow
def test_fsdp2_sharded_policy_each_preset(tmp_path):
    from test_trl import make_model

    make_model(0).save_pretrained(tmp_path / "model")  # before the launch: the workers have no barrier of their own
    proc = launch_two(__file__, str(tmp_path), timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r0, r1 = (json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2))
    for preset in PRESETS:
        a, b = r0[preset], r1[preset]
        assert a["finite"] and a["params"] == b["params"], f"{preset}: processes hold different parameters"
        rows = lambda r: [(h["step"], h["fresh_rows"], h["replay_rows"]) for h in r["history"]]  # noqa: E731
        assert rows(a) == rows(b), f"{preset}: unequal row counts"
        for h in a["history"] + b["history"]:
            assert all(birth < h["step"] for birth in h["replay_birth_steps"]), (preset, h)
        if preset == "grpo":
            assert a["history"] == b["history"] == []
            continue
        assert [h["inserted"] for h in b["history"]][UNEVEN_STEP] == 0  # the zero-variance step stores nothing
        assert [h["inserted"] for h in a["history"]][UNEVEN_STEP] > 0
        assert sum(h["replay_rows"] for h in a["history"]) > 0, f"{preset}: nothing was replayed"
        if "pool" in preset:  # the share is a whole group from step 1 on; fresh rows are displaced
            assert all(h["fresh_rows"] + h["replay_rows"] == 8 for h in a["history"])
            assert any(h["replay_rows"] for h in a["history"][UNEVEN_STEP + 1:])


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker(sys.argv[sys.argv.index("--worker") + 1])
