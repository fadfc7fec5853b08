#!/usr/bin/env bash
# Creates .venv-verl (if needed): the verl integration's own environment. verl 0.9.1 pins transformers<5.11 and
# tensordict<=0.10, which conflicts with the main environment (transformers 5.24 for TRL), so verl lives here.
# torch is pinned to the 2.13.0 CPU build first (as in scripts/setup.sh), then verl with its `verl-core` extra
# (Ray, TransferQueue, ...: needed to import ray_trainer / main_ppo), the test tools, and this project in
# editable mode with its core dependencies only (torch and numpy; the `app` extra would pull transformers>=5.11
# back in, and the integration does not need it).
# Idempotent: a second run only checks the stamp. Measured here: about 3 minutes on 2 idle CPUs (up to 5.5 under load).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."  # the real checkout, also when called through a linked copy
PY=${PYTHON:-python3}
VENV=${VERL_VENV:-.venv-verl}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.grpo-replay-verl-installed
want=$(cat scripts/setup_verl.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q "verl[verl-core]==0.9.1" "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100" "pyyaml>=6"
"$VENV/bin/python" -m pip install -q -e .
echo "$want" > "$stamp"
