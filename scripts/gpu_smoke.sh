#!/usr/bin/env bash
# GPU smoke test (not part of CI): on one CUDA device, a few steps of the built-in trainer and of the TRL
# backend in bf16 on the testbed's from-config model, with replay's invariants checked on every composed batch
# (no replay row of age 0 or > tau_max, no empty-mask replay row, the configured replay share, finite losses).
# Usage: bash scripts/gpu_smoke.sh [OUT_DIR] [extra smoke_check.py flags]; exit 0 = every invariant held.
# The same checker runs on CPU in the test suite (tests/trainer/test_smoke_check.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-runs/gpu-smoke-$(date +%Y%m%d-%H%M%S)}
shift || true
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "gpu_smoke: torch sees no CUDA device")'
exec "$PY" scripts/smoke_check.py --device cuda --dtype bfloat16 --steps 6 --out "$OUT" "$@"
