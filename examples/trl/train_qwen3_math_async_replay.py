"""Train Qwen3-0.6B-Base on MATH with ReplayAsyncGRPOTrainer: TRL's AsyncGRPOTrainer fed by a vLLM server on its own
GPU. Not runnable on CPU (docs/trl.md has the CPU variant: an in-process worker instead of the server).

    # GPU 0: the vLLM server the rollout worker generates with and the trainer streams weights into
    CUDA_VISIBLE_DEVICES=0 VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen3-0.6B-Base --dtype float32 \
        --max-model-len 4096 --weight-transfer-config '{"backend":"nccl"}'
    # GPUs 1-7: the trainer
    CUDA_VISIBLE_DEVICES=1,2,3,4,5,6,7 accelerate launch --num_processes 7 \
        examples/trl/train_qwen3_math_async_replay.py --config examples/trl/qwen3_0.6b_math_async_replay.yaml

Needs (from the grpo-replay checkout's root): pip install -e '.[app,trl,vllm,tensorboard]'
(`app` brings math-verify, the reward; `tensorboard` is the YAML's `report_to`). `preflight` checks both before
the dataset or the model loads.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from datasets import load_dataset
from trl import TrlParser

from grpo_replay.integrations.trl import ReplayAsyncGRPOConfig, ReplayAsyncGRPOTrainer
# The synchronous recipe's prompt, dataset arguments and reward (a module-level function: TRL's rollout worker
# runs the reward in a spawned process, so it must be importable there).
from train_qwen3_math_replay import PROMPT, ScriptArguments, accuracy_reward, preflight


@dataclass
class AsyncScriptArguments(ScriptArguments):
    # AsyncGRPOConfig holds dtype and trust_remote_code itself, so TRL's ModelConfig (which repeats them) is not used.
    model_name_or_path: str = field(default="Qwen/Qwen3-0.6B-Base")


def main() -> None:
    script_args, training_args = TrlParser((AsyncScriptArguments, ReplayAsyncGRPOConfig)).parse_args_and_config()
    missing = preflight(training_args)
    if missing:
        print("train_qwen3_math_async_replay.py: " + "; ".join(missing), file=sys.stderr)
        sys.exit(2)
    dataset = load_dataset(script_args.dataset_name, split=script_args.dataset_split)
    dataset = dataset.map(lambda x: {"prompt": PROMPT.format(problem=x["problem"])})
    trainer = ReplayAsyncGRPOTrainer(
        model=script_args.model_name_or_path,
        reward_funcs=accuracy_reward,
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # output_dir/trainer_state.json: the per-step log (replay/share), also without checkpoints


if __name__ == "__main__":
    main()
