"""The real-model path: `--model <local dir> --data <jsonl> --reward math` on a tiny Qwen2 and GSM8K, offline."""
import json

from grpo_replay.cli import main
from grpo_replay.tasks.math import MathTask
from helpers import SHARED_DATA, build_tiny_model, read_jsonl

GSM8K = SHARED_DATA / "train" / "gsm8k_train.jsonl"


def test_math_task_prompts_and_reward(tmp_path):
    model = build_tiny_model(tmp_path / "model")
    from transformers import AutoTokenizer

    task = MathTask(AutoTokenizer.from_pretrained(model), str(GSM8K), n_heldout=4)
    assert len(task.train) == 7473 - 4 and len(task.held) == 4
    p = task.held[0]
    assert p.prompt.startswith("<|user|>") and p.prompt.endswith("<|assistant|>")  # chat template applied
    assert "\\boxed{}" in p.prompt
    assert task.reward(f"so the answer is \\boxed{{{p.answer}}}", p) == 1.0
    assert task.reward("so the answer is \\boxed{-12345}", p) == 0.0
    assert task.reward(p.answer, p) == 0.0  # no box: not graded as correct


def test_train_math_reward_tiny_model_gsm8k(tmp_path):
    model = build_tiny_model(tmp_path / "model")
    out = tmp_path / "run"
    sets = {
        "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8, "eval_problems": 4, "eval_samples": 2,
        "eval_every": 0, "checkpoint_every": 0, "replay.warmup_steps": 0,
    }
    argv = ["train", "--reward", "math", "--model", str(model), "--data", str(GSM8K), "--out", str(out),
            "--steps", "3", "--no-progress", "--device", "cpu"]
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    assert main(argv) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["generated"] for r in rows] == [4, 8, 12]
    assert all(r["reward/errors"] == 0 and r["reward/timeouts"] == 0 for r in rows)  # every completion was graded
    summary = json.loads((out / "summary.json").read_text())
    assert summary["setup"]["train_prompts"] == 7473 - 4
    assert (out / "ckpt-000003" / "model" / "model.safetensors").is_file()
