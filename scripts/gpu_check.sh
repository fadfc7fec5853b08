#!/usr/bin/env bash
# The first thing to run on a fresh GPU node, offline: it uses the Python and torch already installed (a container's,
# or the wheelhouse install's: docs/gpu.md), downloads nothing (HF_HUB_OFFLINE=1), makes no environment, and writes
# OUT/gpu_check.json and OUT/gpu_check.md saying what passed, what failed and what was skipped, and why:
#   testbed  the main job (grpo-replay train on the embedded testbed) on the GPU: its figures and step time
#   memory   one training step of Qwen3-0.6B- and 1.7B-shaped models (random weights) at the paper recipe's per-GPU
#            shapes: CUDA peak memory per phase beside `grpo-replay preflight`'s estimate for the same launch
#   scoring  the chunked log-prob scoring's peak beside its estimate
#   trl      ReplayGRPOTrainer for 2 steps with a tiny random Qwen3 and transformers generation, replay rows in the loss
#   vllm     not started; the report says whether it is installed
# Meant to finish within 8 minutes on one H100 / H200 (a time budget skips what is left, saying so; not yet timed on
# a GPU). The checks are grpo_replay.preflight.gpu_check (`python -m grpo_replay.preflight.gpu_check --help`); this
# script picks the Python and, when that Python has no grpo_replay installed, this checkout's src/.
# Usage: bash scripts/gpu_check.sh [OUT_DIR] [MODULE ARGS...]; env PYTHON (default python3). On a CPU machine the dry
# run is `bash scripts/gpu_check.sh OUT --device cpu --tiny`.
# Exit: 0 every check passed or was skipped; 3 a check failed; 2 refused before any check (no CUDA device, bad args).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=runs/gpu-check-$(date +%Y%m%d-%H%M%S)
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then OUT=$1; shift; fi
PY=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
  TOKENIZERS_PARALLELISM=false
# One GPU (the first, unless chosen; the module does the same): transformers' Trainer spreads an unlaunched run over
# every visible GPU.
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
if ! "$PY" -c 'import grpo_replay' 2>/dev/null; then
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" -m grpo_replay.preflight.gpu_check --out "$OUT" "$@"
