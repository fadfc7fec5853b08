"""Embedded CPU testbed: synthetic addition task with optional scratchpad, character-level
tokenizer, tiny Llama/Qwen2 causal LM and a cached supervised warm start.  See docs/testbed.md.
"""

from .testbed_config import TestbedConfig
from .model import (build_model, decode_completions, generate_completions, model_config,
                    n_params, sampled_pass_rate)
from .task import (TestbedProblem, TestbedTask, extract_answer, make_problem, target_completion,
                   uses_working)
from .policy_stats import forced_mode_pass_rate, policy_stats
from .tokenizer import build_tokenizer
from .warmstart import load_cached, train_warm_start, warm_start

__all__ = [
    "TestbedConfig", "TestbedProblem", "TestbedTask", "build_tokenizer", "build_model",
    "model_config", "n_params", "generate_completions", "decode_completions",
    "sampled_pass_rate", "warm_start", "train_warm_start", "load_cached", "extract_answer",
    "uses_working", "make_problem", "target_completion", "policy_stats", "forced_mode_pass_rate",
]
