#!/usr/bin/env bash
# Multi-node launch with Ray (NOT run in this repository's CI; see docs/verl.md).
#
# 1. On the head node:     ray start --head --port=6379 --num-gpus=8
# 2. On every other node:  ray start --address=<head-ip>:6379 --num-gpus=8
#    (same Python environment, same code checkout and data paths on every node; `ray status` lists all GPUs)
# 3. On the head node run this script. RAY_ADDRESS=auto makes verl's ray.init() (inside run_ppo) join the
#    running cluster instead of starting a local one; leave ray_kwargs.ray_init.num_cpus unset (null) then.
#
# The replay buffer lives in the driver's TaskRunner actor (one buffer for the whole job, on the node that runs
# the TaskRunner); checkpoints go to trainer.default_local_dir, which must be on storage the driver node can
# write and read back on resume.
set -euo pipefail
export RAY_ADDRESS=${RAY_ADDRESS:-auto}
NNODES=${NNODES:-2} N_GPUS=${N_GPUS:-8} PROMPTS=${PROMPTS:-256} \
  exec bash "$(dirname "$0")/run_paper_single_node.sh" \
  trainer.default_local_dir="${CKPT_DIR:-/shared/checkpoints/grpo-replay}" \
  "$@"
