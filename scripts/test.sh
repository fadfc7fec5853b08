#!/usr/bin/env bash
# The README's test command: set up (idempotent) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Two pytest-xdist workers: most tests are one-threaded Python (torch_threads=1), so two CPU cores take half the
# wall time. PYTEST_WORKERS=0 runs in one process (for -x, --pdb, or a one-core machine).
exec .venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" "$@"
