#!/usr/bin/env bash
# Multi-node launch with Ray (NOT run in this repository's CI; see docs/verl.md).
#
# 1. On the head node:     ray start --head --port=6379 --num-gpus=8
# 2. On every other node:  ray start --address=<head-ip>:6379 --num-gpus=8
#    (same Python environment, made by scripts/setup_verl_gpu.sh, same code checkout and data paths on every node;
#    `ray status` lists all GPUs)
# 3. On the head node run this script. RAY_ADDRESS=auto makes verl's ray.init() (inside run_ppo) join the
#    running cluster instead of starting a local one; leave ray_kwargs.ray_init.num_cpus unset (null) then.
#
# TRAINER / MODE as in run_paper_single_node.sh. On v1 (the default) the stored rollouts' tensors live in
# TransferQueue's storage units, spread over the Ray nodes (use >= 2 units per node:
# transfer_queue.backend.SimpleStorage.num_data_storage_units); the trainer (TaskRunner actor) keeps about 0.5 KB
# per stored row (the buffer's scalar columns and verl's sampler's copy of each row's tag). On the legacy trainer the
# whole buffer lives in the TaskRunner actor. Checkpoints go to CKPT_DIR/EXP, one folder per arm and seed (EXP names
# PRESET, TRAINER and SEED; see run_paper_single_node.sh), on shared storage (TransferQueue's checkpoint is written
# from every node). A rerun of the same run resumes it; another arm or seed starts fresh.
set -euo pipefail
export RAY_ADDRESS=${RAY_ADDRESS:-auto}
NNODES=${NNODES:-2} N_GPUS=${N_GPUS:-8} PROMPTS=${PROMPTS:-256} \
  CKPT_ROOT=${CKPT_DIR:-/shared/checkpoints/grpo-replay} \
  exec bash "$(dirname "$0")/run_paper_single_node.sh" \
  transfer_queue.backend.SimpleStorage.num_data_storage_units="$(( 2 * ${NNODES:-2} ))" \
  "$@"
