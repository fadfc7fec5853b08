#!/usr/bin/env bash
# The verl GPU environment (verl 0.9.1 with its vLLM and FSDP extras), for examples/verl/*.sh and
# scripts/gpu_smoke.sh. Idempotent (a stamp file). Needs a CUDA 13 toolkit (nvcc) to build flash-attn and an NVIDIA
# driver >= 580 to run the CUDA 13 torch it installs.
#
# Why this order: verl[vllm,fsdp]==0.9.1 pins torch 2.11.0 and flash-attn 2.8.3; flash-attn has no wheel on PyPI,
# and its source build imports torch, so it fails under pip's build isolation. So: torch first (PyPI's 2.11.0 is the
# CUDA 13 build verl's cu130 extras expect), flash-attn with --no-build-isolation, then verl, then this project with
# its app extra (what `grpo-replay preflight` and the other commands import), transformers held at the version verl
# installed so that the extra does not move it off verl's pin.
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
# flash-attn for this host's GPU architecture only (by default it compiles every one it supports: hours). Its own
# FLASH_ATTN_CUDA_ARCHS takes 80/90/100/110/120 (an 8.6 card runs the sm_80 code); torch's extension builder reads
# TORCH_CUDA_ARCH_LIST. Either may be set by hand beforehand (e.g. to build on a machine without the target GPU).
CAP=$( (nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null || true) | head -1 | tr -d ' ')
if [ -n "$CAP" ]; then
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$CAP} FLASH_ATTN_CUDA_ARCHS=${FLASH_ATTN_CUDA_ARCHS:-${CAP%%.*}0}
fi
echo "setup_verl_gpu: flash-attn for FLASH_ATTN_CUDA_ARCHS=${FLASH_ATTN_CUDA_ARCHS:-all (no GPU listed)}" >&2
MAX_JOBS=${MAX_JOBS:-8} "${PIP[@]}" --no-build-isolation "flash-attn==2.8.3"
"${PIP[@]}" "verl[vllm,fsdp]==0.9.1"
TRANSFORMERS=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("transformers"))')
"${PIP[@]}" -e ".[app]" ${TRANSFORMERS:+"transformers==$TRANSFORMERS"}
touch "$STAMP"
