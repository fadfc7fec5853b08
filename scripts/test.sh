#!/usr/bin/env bash
# The README's test command: set up (idempotent) and run the whole test suite.
#   bash scripts/test.sh [PYTEST ARGS]           the whole suite (or the paths and options given)
#   bash scripts/test.sh --quick [PYTEST ARGS]   the quick tier: the core, the command line's smoke test and every
#                                                contract test (tests/**/test_*contract*.py: a new one joins by its
#                                                name), tests marked `slow` left out (docs/development.md)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "${1:-}" = "--quick" ]; then
  shift
  mapfile -t contracts < <(find tests -name 'test_*contract*.py' -not -path '*/verl_integration/*' | sort)
  set -- -m "not slow" tests/core tests/cli "${contracts[@]}" "$@"
fi
# Two pytest-xdist workers: most tests are one-threaded Python (torch_threads=1), so two CPU cores take half the
# wall time. PYTEST_WORKERS=0 runs in one process (for -x, --pdb, or a one-core machine).
exec .venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" "$@"
