#!/usr/bin/env bash
# The first command to run on a GPU machine: every GPU path of the project for a few steps, one line per path.
# The builtin, trl and verl paths first run `grpo-replay preflight` on their own launch (NAME-preflight line; a
# refusal skips the path, before any GPU time), then the launch: each recipe's launcher at one GPU's size.
#   testbed    the built-in trainer and the TRL backend on the testbed model in bf16, replay's invariants checked on
#              every composed batch (scripts/smoke_check.py; the same checker runs on CPU in the test suite)
#   builtin    the built-in trainer with vLLM generation (colocated engine, weight sync) on a hub model, 3 steps
#   trl        the TRL example (ReplayGRPOTrainer, vLLM colocate) under accelerate on 2 GPUs (1 if only one), 2 steps
#              (each then gets a NAME-share line: scripts/check_replay_share.py on its per-step metrics, since a
#              run that replays nothing also exits 0)
#   verl       examples/verl/run_paper_single_node.sh for 2 steps on every GPU, in the verl GPU environment
# Environments: $PYTHON, else .venv-gpu/bin/python, else .venv/bin/python if it has vLLM and sees CUDA, else it makes
# .venv-gpu (pip install -e '.[app,trl,vllm,tensorboard,dev]'); verl's is scripts/setup_verl_gpu.sh's .venv-verl-gpu,
# made when missing (builds flash-attn: long). The builtin, trl and verl paths download MODEL and MATH from the hub.
# Usage: bash scripts/gpu_smoke.sh [OUT_DIR]; env: MODEL (Qwen/Qwen3-0.6B-Base), GPU_SMOKE_PATHS ("testbed builtin trl
# verl"), GPU_SMOKE_TIMEOUT (seconds per path, 3600), GPU_SMOKE_VENV, VERL_GPU_VENV.
# GPU_SMOKE_DRY_RUN=1 prints each path's command (name, then the arguments, tab-separated) and runs nothing, GPU or
# not (tests/docs/test_gpu_commands.py checks those commands on CPU).
# Exit: 0 every path passed; 2 refused (no GPU, an unknown path) before anything runs; 3 a path failed (its log is
# named on its line).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-runs/gpu-smoke-$(date +%Y%m%d-%H%M%S)}
MODEL=${MODEL:-Qwen/Qwen3-0.6B-Base}
PATHS=${GPU_SMOKE_PATHS:-testbed builtin trl verl}
LIMIT=${GPU_SMOKE_TIMEOUT:-3600}
DRY=${GPU_SMOKE_DRY_RUN:-0}
VENV=${GPU_SMOKE_VENV:-.venv-gpu}
VERL_VENV=${VERL_GPU_VENV:-.venv-verl-gpu}
case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac           # absolute or relative to the checkout
case $VERL_VENV in /*) ;; *) VERL_VENV=$ROOT/$VERL_VENV ;; esac
refuse() { echo "gpu_smoke: $*" >&2; exit 2; }

for p in $PATHS; do
  case $p in testbed|builtin|trl|verl) ;; *) refuse "unknown path '$p' in GPU_SMOKE_PATHS; allowed: testbed builtin trl verl";; esac
done
if [ "$DRY" = 1 ]; then
  NGPU=2 PY=python VPY=python
else
  NGPU=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' )
  [ "$NGPU" -gt 0 ] || refuse "no NVIDIA GPU found (nvidia-smi lists none): this script runs the GPU paths only; on a CPU machine the test suite is the check (bash scripts/test.sh)"
fi

find_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  if [ -x "$VENV/bin/python" ]; then echo "$VENV/bin/python"; return; fi
  if [ -x .venv/bin/python ] && .venv/bin/python -c 'import vllm, torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo .venv/bin/python; return
  fi
  echo "gpu_smoke: making $VENV (pip install -e '.[app,trl,vllm,tensorboard,dev]'; vLLM brings CUDA torch)" >&2
  python3 -m venv "$VENV" && "$VENV/bin/python" -m pip install -q -e '.[app,trl,vllm,tensorboard,dev]' >&2 || return 1
  echo "$VENV/bin/python"
}

FAILED=0
# run_path NAME LOG COMMAND...: one line per path: ok / FAILED (exit code, log) / what the dry run prints.
run_path() {
  local name=$1 log=$2 t0=$SECONDS rc
  shift 2
  if [ "$DRY" = 1 ]; then
    (IFS=$'\t'; echo "$name"$'\t'"$*")
    return
  fi
  timeout "$LIMIT" "$@" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    printf '%-8s ok      %5ds  %s\n' "$name" $((SECONDS - t0)) "$log"
  else
    printf '%-8s FAILED  %5ds  exit %d, log %s\n' "$name" $((SECONDS - t0)) $rc "$log"
    FAILED=1
  fi
  return $rc
}
skip() { printf '%-8s skipped        %s\n' "$1" "$2"; }
# check_share NAME RUN_DIR: the run's realised replay share against the paper preset's ratio 0.5 (a run that
# replayed nothing exits 0 too); its own line, NAME-share, after the path's when that passed.
check_share() {
  local name=$1 run=$2
  run_path "$name-share" "$OUT/$name-share.log" "$PY" scripts/check_replay_share.py "$run" --ratio 0.5
}

[ "$DRY" = 1 ] || mkdir -p "$OUT"
export HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
if [ "$DRY" != 1 ] && [[ " $PATHS " =~ \ (testbed|builtin|trl|verl)\  ]]; then
  PY=$(find_python) || { echo "gpu_smoke: could not make $VENV" >&2; exit 3; }
fi

for p in $PATHS; do
  case $p in
  testbed)
    run_path testbed "$OUT/testbed.log" env CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" HF_HUB_OFFLINE=1 \
      "$PY" scripts/smoke_check.py --device cuda --dtype bfloat16 --steps 6 --out "$OUT/testbed" ;;
  builtin)
    # The paper recipe's launcher at one GPU's size: evaluation through vLLM (eval_every), a checkpoint.
    LAUNCH=(train --model "$MODEL" --reward math --data word_sums --steps 3 --device cuda --out "$OUT/builtin"
      --no-progress --set generator=vllm --set prompts_per_step=4 --set group_size=4 --set max_new_tokens=64
      --set micro_batch_size=4 --set eval_every=3 --set eval_problems=8 --set eval_samples=1
      --set checkpoint_every=3 --set replay.warmup_steps=1)
    run_path builtin-preflight "$OUT/builtin-preflight.log" "$PY" -m grpo_replay.cli preflight grpo-replay "${LAUNCH[@]}" \
      && run_path builtin "$OUT/builtin.log" env CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" \
        "$PY" -m grpo_replay.cli "${LAUNCH[@]}" \
      && check_share builtin "$OUT/builtin" ;;
  trl)
    N=$(( NGPU >= 2 ? 2 : 1 ))
    LAUNCH=(--config_file examples/trl/accelerate_multi_gpu.yaml --num_processes "$N"
      examples/trl/train_qwen3_math_replay.py --config examples/trl/qwen3_0.6b_math_replay.yaml
      --model_name_or_path "$MODEL" --output_dir "$OUT/trl" --max_steps 2 --per_device_train_batch_size 8
      --gradient_accumulation_steps 1 --steps_per_generation 1 --num_generations 4 --max_completion_length 512
      --replay_warmup_steps 0 --report_to none --save_strategy no)
    run_path trl-preflight "$OUT/trl-preflight.log" "$PY" -m grpo_replay.cli preflight accelerate launch "${LAUNCH[@]}" \
      && run_path trl "$OUT/trl.log" "$PY" -m accelerate.commands.launch "${LAUNCH[@]}" \
      && check_share trl "$OUT/trl" ;;
  verl)
    if [ "$DRY" != 1 ] && [ ! -x "$VERL_VENV/bin/python" ]; then
      echo "gpu_smoke: making $VERL_VENV (scripts/setup_verl_gpu.sh; flash-attn compiles, which takes long)" >&2
      VERL_GPU_VENV=$VERL_VENV bash scripts/setup_verl_gpu.sh >"$OUT/verl-setup.log" 2>&1 \
        || { printf '%-8s FAILED  setup, log %s\n' verl "$OUT/verl-setup.log"; FAILED=1; continue; }
    fi
    [ "$DRY" = 1 ] || VPY=$VERL_VENV/bin/python
    # A few MATH problems as verl's math_dataset.py writes them (data_source selects verl's MATH reward).
    run_path verl-data "$OUT/verl-data.log" "$VPY" - "$OUT/verl-data" <<'EOF'
import sys
from pathlib import Path

import datasets

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
src = "DigitalLearningGmbH/MATH-lighteval"
for split, n in (("train", 64), ("test", 16)):
    rows = datasets.load_dataset(src, split=split).select(range(n))

    def to_verl(x, i):
        s = x["solution"]
        j = s.rfind("\\boxed{")
        depth, k = 0, j + 6
        for k in range(j + 6, len(s)):
            depth += (s[k] == "{") - (s[k] == "}")
            if depth == 0:
                break
        return {"data_source": src, "ability": "math",
                "prompt": [{"role": "user", "content": x["problem"] + " Let's think step by step and output the final answer within \\boxed{}."}],
                "reward_model": {"style": "rule", "ground_truth": s[j + 7 : k]},
                "extra_info": {"split": split, "index": i}}

    rows.map(to_verl, with_indices=True, remove_columns=rows.column_names).to_parquet(str(out / f"{split}.parquet"))
EOF
    LAUNCH=(MODEL="$MODEL" DATA="$OUT/verl-data" PRESET=paper SEED=0 N_GPUS="$NGPU" PROMPTS=8 EXP=gpu-smoke
      CKPT_ROOT="$OUT/verl" bash examples/verl/run_paper_single_node.sh trainer.total_training_steps=2
      data.max_response_length=256 replay.warmup_steps=0 trainer.save_freq=2 trainer.test_freq=2
      trainer.val_before_train=false)
    run_path verl-preflight "$OUT/verl-preflight.log" "$PY" -m grpo_replay.cli preflight "${LAUNCH[@]}" \
      && run_path verl "$OUT/verl.log" env PATH="$VERL_VENV/bin:$PATH" "${LAUNCH[@]}" ;;
  esac
done
[ "$DRY" = 1 ] && exit 0
exit $(( FAILED ? 3 : 0 ))
