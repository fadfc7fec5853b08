"""Step time of ReplayGRPOTrainer vs plain TRL GRPOTrainer on the same tiny model, in one run (CPU).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/trl_step_time.py [--steps 8] [--repeats 3] [--hidden 64]

Arms: `grpo_trainer` (trl.GRPOTrainer), `replay_off` (ReplayGRPOTrainer, preset grpo: must be within ~5 %),
`replay_on` (preset paper, warm-up 1, replay_ratio 0.5: the update has 1.5x the rows, plus one no-grad forward
for the behaviour log-probs that TRL skips when generation is aligned with the optimizer step).
Per-step wall time is taken between optimizer steps (generation + scoring + composition + update), the first
step of each run dropped; arms are interleaved `repeats` times and the median per arm is reported.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integrations"))

import torch  # noqa: E402
import trl  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config, TrainerCallback  # noqa: E402

from test_trl import CHARS, make_dataset, make_tokenizer, reward_fn  # noqa: E402  (shared tiny fixtures)

from grpo_replay.integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer  # noqa: E402


class StepTimer(TrainerCallback):
    def __init__(self):
        self.stamps: list[float] = []

    def on_step_begin(self, args, state, control, **kw):
        if not self.stamps:
            self.stamps.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kw):
        self.stamps.append(time.perf_counter())


def run(arm: str, a: argparse.Namespace) -> tuple[list[float], int]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        Qwen2Config(vocab_size=len(CHARS) + 2, hidden_size=a.hidden, intermediate_size=2 * a.hidden,
                    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, pad_token_id=0,
                    eos_token_id=1, max_position_embeddings=128)
    )
    kw = dict(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, gradient_checkpointing=False,
              per_device_train_batch_size=a.batch, num_generations=4, max_completion_length=a.completion,
              max_steps=a.steps, learning_rate=1e-3, report_to="none", save_strategy="no", logging_steps=1000,
              seed=0, disable_tqdm=True)
    if arm == "grpo_trainer":
        cls, args = trl.GRPOTrainer, trl.GRPOConfig(**kw)
    else:
        preset = "grpo" if arm == "replay_off" else "paper"
        cls, args = ReplayGRPOTrainer, ReplayGRPOConfig(**kw, replay_preset=preset, replay_warmup_steps=1)
    timer = StepTimer()
    trainer = cls(model=model, reward_funcs=reward_fn, args=args, train_dataset=make_dataset(256),
                  processing_class=make_tokenizer(), callbacks=[timer])
    trainer.train()
    steps = [b - a_ for a_, b in zip(timer.stamps, timer.stamps[1:])][2:]  # drop the first two (warm-up, no replay)
    rows = sum(h["replay_rows"] for h in getattr(trainer, "replay_history", []))
    return steps, rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--completion", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    arms = ["grpo_trainer", "replay_off", "replay_on"]
    times: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(a.repeats):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            steps, _ = run(arm, a)
            times[arm].extend(steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["grpo_trainer"]
    report = {
        "config": vars(a),
        "median_step_s": med,
        "relative_to_grpo_trainer": {k: v / base for k, v in med.items()},
        "replay_on_rows_per_update": f"{a.batch} fresh + {round(0.5 * a.batch)} replay after warm-up",
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
