#!/usr/bin/env bash
# SmolLM2-135M-Instruct (GGUF, float32 on CPU) on word_sums:2,3 (two- and three-digit sums asked in words): the
# paper's preset and plain GRPO, same seed, model, prompts and settings; the two arms run side by side.
# Resumable: run the same command again and each arm continues from its last checkpoint (finished arms are kept).
# STEPS (default 60, about an hour on 2 cores) sets the length; the report is rebuilt from whatever the run directories hold.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-.venv/bin/python}
MODEL=$($PY -m grpo_replay.app.models)
OUT=${OUT:-runs/smollm2}
mkdir -p "$OUT"
COMMON=(--reward math --model "$MODEL" --data word_sums:2,3 --steps "${STEPS:-60}" --device cpu --no-progress
  --set prompts_per_step=4 --set group_size=4 --set max_new_tokens=20 --set temperature=0.6 --set lr=1e-5
  --set eval_every=10 --set eval_problems=32 --set eval_samples=2
  --set checkpoint_every=5 --set keep_checkpoints=1 --set torch_threads=1 --set replay.warmup_steps=5)
for preset in paper grpo; do
  $PY -m grpo_replay.cli train --preset "$preset" --out "$OUT/$preset-seed0" "${COMMON[@]}" > "$OUT-$preset.log" 2>&1 &
done
wait
$PY docs/results/smollm2/report.py "$OUT" docs/results/smollm2
