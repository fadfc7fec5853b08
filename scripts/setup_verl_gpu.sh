#!/usr/bin/env bash
# The verl GPU environment (verl 0.9.1 with its vLLM and FSDP extras), for examples/verl/*.sh and
# scripts/gpu_smoke.sh. Idempotent (a stamp file). Needs a CUDA 13 toolkit (nvcc) to build flash-attn.
#
# Why this order: verl[vllm,fsdp]==0.9.1 pins torch 2.11.0 and flash-attn 2.8.3; flash-attn has no wheel on PyPI,
# and its source build imports torch, so it fails under pip's build isolation. So: torch first (PyPI's 2.11.0 is the
# CUDA 13 build verl's cu130 extras expect), flash-attn with --no-build-isolation, then verl, then this project
# (core dependencies only: the app extra would move transformers off verl's pin).
# Usage: bash scripts/setup_verl_gpu.sh   (VERL_GPU_VENV, default .venv-verl-gpu; MAX_JOBS for the flash-attn build)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VERL_GPU_VENV:-.venv-verl-gpu}
STAMP="$VENV/.grpo-replay-verl-gpu-0.9.1"
if [ -f "$STAMP" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "torch==2.11.0" "torchvision==0.26.0" "torchaudio==2.11.0"
"${PIP[@]}" packaging ninja psutil wheel "setuptools>=70.1"
MAX_JOBS=${MAX_JOBS:-8} "${PIP[@]}" --no-build-isolation "flash-attn==2.8.3"
"${PIP[@]}" "verl[vllm,fsdp]==0.9.1"
"${PIP[@]}" -e .
touch "$STAMP"
