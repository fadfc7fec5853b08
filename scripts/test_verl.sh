#!/usr/bin/env bash
# Runs the verl integration tests (CPU, synthetic DataProto batches) and the preflight's verl launch corpus in
# .venv-verl, creating it if needed.
# Extra arguments go to pytest. About 5 minutes on 2 idle CPUs (each fit test starts Ray and TransferQueue).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_verl.sh
VENV=${VERL_VENV:-.venv-verl}
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONWARNINGS=${PYTHONWARNINGS:-ignore::DeprecationWarning}
exec "$VENV/bin/python" -m pytest tests/integrations/verl_integration tests/preflight/test_corpus_verl.py -q \
  -p no:cacheprovider -o asyncio_default_fixture_loop_scope=function "$@"
