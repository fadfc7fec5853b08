import json
from pathlib import Path

import pytest

# Tiny sizes: a 1-layer width-32 model, 1-digit sums, 8 prompts x 4 rollouts, an 80-step warm start
# (about 12 % sampled pass rate, so groups with reward variance occur).
TINY = {
    "steps": 6,
    "prompts_per_step": 8,
    "group_size": 4,
    "eval_every": 3,
    "eval_problems": 16,
    "eval_samples": 2,
    "checkpoint_every": 2,
    "lr": 3e-3,
    "progress": False,
    "replay.warmup_steps": 2,
    "testbed.digits_max": 1,
    "testbed.difficulty_weights": [1.0],
    "testbed.working_prob": [0.2],
    "testbed.hidden_size": 32,
    "testbed.num_layers": 1,
    "testbed.num_heads": 2,
    "testbed.intermediate_size": 64,
    "testbed.warmstart_max_steps": 80,
    "testbed.warmstart_lr": 0.01,
    "testbed.warmstart_batch": 32,
    "testbed.warmstart_eval_every": 10,
    "testbed.warmstart_eval_problems": 64,
    "testbed.warmstart_min_steps": 0,
    "testbed.target_pass_low": 0.2,
    "testbed.target_pass_high": 0.6,
    "testbed.max_new_tokens": 8,
}


@pytest.fixture(scope="session")
def tiny_overrides(tmp_path_factory):
    cache = tmp_path_factory.mktemp("testbed-cache")
    return {**TINY, "testbed.cache_dir": str(cache)}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def without_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
