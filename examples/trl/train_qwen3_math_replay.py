"""Train Qwen3-0.6B-Base on MATH with ReplayGRPOTrainer (vLLM colocate, multi-GPU). Not runnable on CPU.

    accelerate launch --config_file examples/trl/accelerate_multi_gpu.yaml --num_processes 8 \
        examples/trl/train_qwen3_math_replay.py --config examples/trl/qwen3_0.6b_math_replay.yaml

Needs (from the grpo-replay checkout's root): pip install -e '.[app,trl,vllm,tensorboard]'
(`app` brings math-verify, the reward; `tensorboard` is the YAML's `report_to`). `preflight` checks both, and vLLM,
before the dataset or the model loads.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field

from datasets import load_dataset
from trl import ModelConfig, TrlParser

from grpo_replay.integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer

PROMPT = (
    "Solve the following math problem. Reason step by step and put the final answer in \\boxed{{}}.\n\n"
    "Problem: {problem}\n\nSolution:"
)


@dataclass
class ScriptArguments:
    dataset_name: str = field(default="DigitalLearningGmbH/MATH-lighteval")
    dataset_split: str = field(default="train")


def last_boxed(text: str) -> str | None:
    i = text.rfind("\\boxed{")
    if i < 0:
        return None
    depth, j = 0, i + len("\\boxed{") - 1
    for k in range(j, len(text)):
        depth += text[k] == "{"
        depth -= text[k] == "}"
        if depth == 0:
            return text[j + 1 : k]
    return None


def accuracy_reward(completions, solution, **kwargs):
    """Binary verifiable reward: the completion's last \\boxed{} answer verifies against the reference's."""
    from math_verify import parse, verify

    rewards = []
    for completion, ref in zip(completions, solution):
        gold = last_boxed(ref)
        pred = last_boxed(completion)
        if gold is None or pred is None:
            rewards.append(0.0)
            continue
        try:
            rewards.append(float(verify(parse(f"${gold}$"), parse(f"${pred}$"))))
        except Exception:
            rewards.append(0.0)
    return rewards


# report_to name -> the module transformers' callback imports, and the grpo-replay extra that installs it
TRACKERS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "trackio": ("trackio", "trackio")}


def preflight(training_args) -> list[str]:
    """What this launch needs and lacks, each with its install line: [] when it can start. Checked before the
    dataset and the model load: otherwise a missing tracker fails only once the model is loaded, and a missing
    reward package only at the first reward call, after vLLM has started and generated."""
    needs = [("math_verify", "app", "the reward")]
    if getattr(training_args, "use_vllm", False):  # the async config has no such field: its server is vLLM
        needs.append(("vllm", "vllm", "use_vllm"))
    for name in training_args.report_to or []:
        if name in TRACKERS:
            module, extra = TRACKERS[name]
            needs.append((module, extra, f"report_to {name}"))
    return [f"{why} needs the `{module}` package: pip install -e '.[{extra}]' in the grpo-replay checkout"
            for module, extra, why in needs if importlib.util.find_spec(module) is None]


def main() -> None:
    script_args, training_args, model_args = TrlParser(
        (ScriptArguments, ReplayGRPOConfig, ModelConfig)
    ).parse_args_and_config()
    missing = preflight(training_args)
    if missing:
        print("train_qwen3_math_replay.py: " + "; ".join(missing), file=sys.stderr)
        sys.exit(2)
    dataset = load_dataset(script_args.dataset_name, split=script_args.dataset_split)
    dataset = dataset.map(lambda x: {"prompt": PROMPT.format(problem=x["problem"])})
    trainer = ReplayGRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=accuracy_reward,
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # output_dir/trainer_state.json: the per-step log (replay/share), also without checkpoints


if __name__ == "__main__":
    main()
