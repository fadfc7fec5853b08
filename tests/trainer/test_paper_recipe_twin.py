"""CPU twin of docs/paper_table.md's built-in recipe: the documented command's own `--set` keys (vLLM generation,
held-out evaluation every eval_every steps, checkpoints, micro_batch_size) through `grpo-replay train`'s real
CLI and loop, scaled down (a tiny model folder, 6-token completions, 3 steps). vLLM is the one stand-in
(tests/fake_vllm.py: the checkpoint sampled with transformers, synced by name); the machine check that refuses
vLLM without CUDA is skipped. Checked: the realised replay share (scripts/check_replay_share.py), that the
held-out evaluation samples through the vLLM engine the recipe names and never through transformers' generate,
the engine seeded with the run's seed, and a fresh run directory with its checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import fake_vllm
import gpu_commands as gc
from tiny_math_model import save_model

SCALE = {"prompts_per_step": "4", "steps": "3", "max_new_tokens": "6", "eval_every": "3", "eval_problems": "4",
         "checkpoint_every": "3"}


def _documented_sets(tmp_path) -> dict[str, str]:
    """The --set keys of the paper table's built-in GPU recipe (its first compare line with generator=vllm)."""
    for r in gc.doc_commands(tmp_path):
        a = r["argv"]
        if r["source"].startswith("docs/paper_table.md") and r["cmd"] == "grpo-replay" and a[:1] == ["compare"] \
                and "--backend" not in a and "generator=vllm" in a:
            return dict(a[i + 1].split("=", 1) for i, w in enumerate(a) if w == "--set")
    raise AssertionError("docs/paper_table.md: no built-in compare command")


def test_builtin_paper_recipe_twin(tmp_path, monkeypatch):
    import transformers

    from grpo_replay.cli import main
    from grpo_replay.trainer import train_config

    sets = _documented_sets(tmp_path / "docs")
    assert sets["generator"] == "vllm" and int(sets["eval_every"]) > 0 and int(sets["checkpoint_every"]) > 0
    sets.update(SCALE)
    sets["replay.warmup_steps"] = "1"
    engine = fake_vllm.install(monkeypatch)
    monkeypatch.setattr(train_config, "check_machine", lambda cfg: None)  # vLLM without CUDA: the stand-in

    def no_hf_generate(*a, **k):
        raise AssertionError("generated through transformers' generate, not the recipe's vLLM engine")

    monkeypatch.setattr(transformers.GenerationMixin, "generate", no_hf_generate)
    model = save_model(tmp_path / "model")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"What is {i % 2 + 1}?", "answer": str(i % 2 + 1),
                                        "source": "twin"}) + "\n" for i in range(32)))
    out = tmp_path / "run"
    assert not out.exists()
    argv = ["train", "--model", str(model), "--reward", "math", "--data", str(data), "--out", str(out),
            "--device", "cpu", "--seed", "3", "--no-progress"]
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    assert main(argv) == 0
    (llm,) = engine.instances
    assert llm.syncs >= 3  # the engine got the policy's weights before each step's generation
    evals = [c for c in llm.calls if c["temperature"] == 0]  # the held-out check's greedy pass
    assert evals and all(c["prompts"] == int(SCALE["eval_problems"]) for c in evals)
    assert len(evals) == 2  # before step 1 and at step 3 (eval_every=3)
    assert json.loads((out / "summary.json").read_text())  # finished
    assert (out / "ckpt-000003").is_dir()
    ok = subprocess.run([sys.executable, str(gc.ROOT / "scripts/check_replay_share.py"), str(out), "--ratio", "0.5"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    cfg = (out / "config.yaml").read_text()
    assert "seed: 3" in cfg and "generator: vllm" in cfg
