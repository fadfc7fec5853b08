"""Step time of ReplayGRPOTrainer vs plain TRL GRPOTrainer on the same tiny model, in one run (CPU), split into
generation, log-prob passes, scoring + composition and update.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/trl_step_time.py [--steps 8] [--repeats 3] [--hidden 64]

Arms: `grpo_trainer` (trl.GRPOTrainer), `replay_off` (ReplayGRPOTrainer, preset grpo: a pass-through),
`replay_on` (preset paper, warm-up 1, replay_ratio 0.5: the update has 1.5x the rows). Generation is aligned with
the optimizer step (TRL's defaults), so TRL computes no old log-probs and neither does replay: the fresh rows'
behaviour log-probs come from the update's own forward.
Per optimizer step: `total` (between optimizer steps), `generation` (TRL's `_generate`), `logprob_passes` (no-grad
`_get_per_token_logps_and_entropies` calls outside the loss, with their count), `score_compose` (the rest of
`_generate_and_score_completions`: rewards, advantages, padding, replay composition) and `update` (total minus
all of `_generate_and_score_completions`: forward + backward + optimizer step). The first two steps of each run
are dropped (warm-up, no replay yet); arms are interleaved `repeats` times; the median per arm is reported.
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

PARTS = ("total", "generation", "logprob_passes", "score_compose", "update", "n_logprob_passes", "update_rows")


class StepTimer(TrainerCallback):
    """Accumulates the instrumented times of the current optimizer step; one record per step."""

    def __init__(self):
        self.acc = {"gen": 0.0, "logp": 0.0, "n_logp": 0, "gas": 0.0, "rows": 0}
        self.start: float | None = None
        self.steps: list[dict[str, float]] = []

    def on_step_begin(self, args, state, control, **kw):
        if self.start is None:
            self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        now = time.perf_counter()
        a = self.acc
        total = now - self.start
        self.steps.append({
            "total": total, "generation": a["gen"], "logprob_passes": a["logp"],
            "score_compose": a["gas"] - a["gen"] - a["logp"], "update": total - a["gas"],
            "n_logprob_passes": a["n_logp"], "update_rows": a["rows"],
        })
        self.acc = {k: 0 for k in a}
        self.start = now


def instrument(trainer, timer: StepTimer) -> None:
    """Wrap the trainer's methods on the instance (TRL calls them through self)."""
    gen, logp, gas, loss = (trainer._generate, trainer._get_per_token_logps_and_entropies,
                            trainer._generate_and_score_completions, trainer._compute_loss)

    def timed_generate(*a, **kw):
        t = time.perf_counter()
        out = gen(*a, **kw)
        timer.acc["gen"] += time.perf_counter() - t
        return out

    def timed_logps(*a, **kw):
        if kw.get("compute_entropy"):  # the loss's own forward: part of the update
            return logp(*a, **kw)
        t = time.perf_counter()
        out = logp(*a, **kw)
        timer.acc["logp"] += time.perf_counter() - t
        timer.acc["n_logp"] += 1
        return out

    def timed_gas(*a, **kw):
        t = time.perf_counter()
        out = gas(*a, **kw)
        timer.acc["gas"] += time.perf_counter() - t
        return out

    def counted_loss(model, inputs):
        timer.acc["rows"] += int(inputs["completion_ids"].shape[0])
        return loss(model, inputs)

    trainer._generate = timed_generate
    trainer._get_per_token_logps_and_entropies = timed_logps
    trainer._generate_and_score_completions = timed_gas
    trainer._compute_loss = counted_loss


def run(arm: str, a: argparse.Namespace) -> list[dict[str, float]]:
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
    instrument(trainer, timer)
    trainer.train()
    return timer.steps[2:]


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
    steps: dict[str, list[dict[str, float]]] = {k: [] for k in arms}
    for r in range(a.repeats):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            steps[arm].extend(run(arm, a))
    med = {arm: {k: statistics.median(s[k] for s in steps[arm]) for k in PARTS} for arm in arms}
    base = med["grpo_trainer"]["total"]
    from grpo_replay.app.provenance import provenance

    report = {
        "provenance": provenance(),
        "config": vars(a),
        "steps_per_arm": {arm: len(s) for arm, s in steps.items()},
        "median_per_step_s": med,
        "total_relative_to_grpo_trainer": {arm: med[arm]["total"] / base for arm in arms},
        # replay's extra time should be its extra update rows: compare the update's cost per row across arms
        "update_ms_per_row": {arm: 1e3 * med[arm]["update"] / max(med[arm]["update_rows"], 1) for arm in arms},
    }
    print(json.dumps(report, indent=1))
    print("\n| arm | total s | generation | log-prob passes (count) | score + compose | update (rows) |")
    print("|---|---|---|---|---|---|")
    for arm in arms:
        m = med[arm]
        print(f"| {arm} | {m['total']:.3f} | {m['generation']:.3f} | {m['logprob_passes']:.3f} "
              f"({m['n_logprob_passes']:g}) | {m['score_compose']:.3f} | {m['update']:.3f} ({m['update_rows']:g}) |")


if __name__ == "__main__":
    main()
