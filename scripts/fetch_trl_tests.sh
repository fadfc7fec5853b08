#!/usr/bin/env bash
# Export TRL's own GRPO test file (and the helpers it imports) from a local TRL git clone into .cache/trl_tests,
# where tests/integrations/trl_own/test_trl_own_grpo_tests.py finds them (or set TRL_TESTS_DIR to another folder).
# TRL's code is Apache-2.0 and stays out of this repository: the test skips when the folder is absent.
#   bash scripts/fetch_trl_tests.sh TRL_GIT_DIR [REF]    REF defaults to v1.16.0, else the clone's HEAD
set -euo pipefail
cd "$(dirname "$0")/.."
git_dir=${1:?usage: bash scripts/fetch_trl_tests.sh TRL_GIT_DIR [REF]}
ref=${2:-v1.16.0}
if ! git -C "$git_dir" rev-parse -q --verify "$ref^{commit}" >/dev/null; then
  echo "fetch_trl_tests: $ref not in $git_dir; using its HEAD ($(git -C "$git_dir" rev-parse --short HEAD))" >&2
  ref=HEAD
fi
out=.cache/trl_tests
mkdir -p "$out"
for f in test_grpo_trainer.py testing_utils.py; do
  git -C "$git_dir" show "$ref:tests/$f" > "$out/$f"
done
git -C "$git_dir" rev-parse "$ref" > "$out/REVISION"
echo "wrote $out (TRL tests at $(cat "$out/REVISION"))"
