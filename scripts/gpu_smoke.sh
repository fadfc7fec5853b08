#!/usr/bin/env bash
# The second command on a GPU machine, after scripts/gpu_check.sh (offline, the installed torch; docs/gpu.md): every GPU
# path of the project for a few steps, one line per path.
# The builtin, trl, trl-async and verl paths first run `grpo-replay preflight` on their own launch (NAME-preflight
# line; a refusal skips the path, before any GPU time), then the launch: each recipe's launcher at one GPU's size,
# then a NAME-share line: scripts/check_replay_share.py on the run's per-step metrics against the paper preset's
# share (a run that replays nothing also exits 0).
#   testbed    the built-in trainer and the TRL backend on the testbed model in bf16, replay's invariants checked on
#              every composed batch (scripts/smoke_check.py; the same checker runs on CPU in the test suite)
#   builtin    the built-in trainer with vLLM generation (colocated engine, weight sync) on a hub model, 3 steps
#   trl        the TRL example (ReplayGRPOTrainer, vLLM colocate) under accelerate on 2 GPUs (1 if only one), 2 steps
#   trl-async  the async TRL example (ReplayAsyncGRPOTrainer): a vLLM server on GPU 0 (trl-async-server line, up
#              when /health answers, stopped when the path ends however it ends), the trainer on GPU 1, 3 steps.
#              Needs 2 GPUs: its NCCL weight transfer refuses the server and the trainer on one device, so on one
#              GPU the path is skipped after its preflight
#   verl       examples/verl/run_paper_single_node.sh for 2 steps on every GPU, in the verl GPU environment, with
#              verl's file logger on (its per-step metrics in OUT/verl-metrics.jsonl, read by the share check)
# Environments: $PYTHON, else .venv-gpu/bin/python, else .venv/bin/python if it has vLLM and sees CUDA, else it makes
# .venv-gpu (pip install -e '.[app,trl,vllm,tensorboard,dev]'); verl's is scripts/setup_verl_gpu.sh's .venv-verl-gpu,
# made when missing (builds flash-attn: long). The builtin, trl, trl-async and verl paths download MODEL and MATH
# from the hub.
# Usage: bash scripts/gpu_smoke.sh [OUT_DIR]; env: MODEL (Qwen/Qwen3-0.6B-Base), GPU_SMOKE_PATHS ("testbed builtin trl
# trl-async verl"), GPU_SMOKE_TIMEOUT (seconds per path, 3600; also the wait for the vLLM server), GPU_SMOKE_VENV,
# VERL_GPU_VENV, GPU_SMOKE_VLLM_PORT (the trl-async server's port, 8000; refused when something already answers there).
# GPU_SMOKE_DRY_RUN=1 prints each path's command (name, then the arguments, tab-separated) and runs nothing, GPU or
# not (tests/docs/test_gpu_commands.py checks those commands on CPU).
# Exit: 0 every path passed (or was skipped, its line says why); 2 refused (no GPU, an unknown path) before anything
# runs; 3 a path failed (its log is named on its line).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-runs/gpu-smoke-$(date +%Y%m%d-%H%M%S)}
MODEL=${MODEL:-Qwen/Qwen3-0.6B-Base}
PATHS=${GPU_SMOKE_PATHS:-testbed builtin trl trl-async verl}
PORT=${GPU_SMOKE_VLLM_PORT:-8000}
LIMIT=${GPU_SMOKE_TIMEOUT:-3600}
DRY=${GPU_SMOKE_DRY_RUN:-0}
VENV=${GPU_SMOKE_VENV:-.venv-gpu}
VERL_VENV=${VERL_GPU_VENV:-.venv-verl-gpu}
case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac           # absolute or relative to the checkout
case $VERL_VENV in /*) ;; *) VERL_VENV=$ROOT/$VERL_VENV ;; esac
refuse() { echo "gpu_smoke: $*" >&2; exit 2; }

for p in $PATHS; do
  case $p in testbed|builtin|trl|trl-async|verl) ;; *) refuse "unknown path '$p' in GPU_SMOKE_PATHS; allowed: testbed builtin trl trl-async verl";; esac
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
# check_share NAME RUN: the run's realised replay share (RUN: its folder or metrics file) against the paper preset's
# ratio 0.5 (a run that replayed nothing exits 0 too); its own line, NAME-share, after the path's when that passed.
check_share() {
  local name=$1 run=$2
  run_path "$name-share" "$OUT/$name-share.log" "$PY" scripts/check_replay_share.py "$run" --ratio 0.5
}

# The trl-async path's vLLM server: started in a session of its own (so that stopping it stops its engine
# processes too), stopped when the path ends and, by the EXIT trap, when the script does (a failure, a timeout, ^C).
SERVER_PID=
server_up() { python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" \
  "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; }
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill -TERM -- -"$SERVER_PID" 2>/dev/null
  for _ in $(seq 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
  kill -KILL -- -"$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=
}
trap stop_server EXIT
trap 'exit 130' INT TERM
# start_server NAME LOG COMMAND...: start it, wait (GPU_SMOKE_TIMEOUT) until /health answers; one line, as run_path.
start_server() {
  local name=$1 log=$2 t0=$SECONDS
  shift 2
  if [ "$DRY" = 1 ]; then
    (IFS=$'\t'; echo "$name"$'\t'"$*")
    return
  fi
  if server_up; then
    printf '%-8s FAILED  %5ds  something already answers on port %s (GPU_SMOKE_VLLM_PORT)\n' "$name" 0 "$PORT"
    FAILED=1
    return 1
  fi
  setsid "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  until server_up; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null || [ $((SECONDS - t0)) -ge "$LIMIT" ]; then
      printf '%-8s FAILED  %5ds  not up (exited, or no /health within %ss), log %s\n' "$name" $((SECONDS - t0)) \
        "$LIMIT" "$log"
      FAILED=1
      stop_server
      return 1
    fi
    sleep 5
  done
  printf '%-8s ok      %5ds  %s\n' "$name" $((SECONDS - t0)) "$log"
}

[ "$DRY" = 1 ] || mkdir -p "$OUT"
export HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
if [ "$DRY" != 1 ] && [[ " $PATHS " =~ \ (testbed|builtin|trl|trl-async|verl)\  ]]; then
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
  trl-async)
    # One process; 12 samples a step (8 fresh + 4 replayed: the paper ratio's third, exactly), warm-up of one step.
    LAUNCH=(--num_processes 1 examples/trl/train_qwen3_math_async_replay.py
      --config examples/trl/qwen3_0.6b_math_async_replay.yaml --model_name_or_path "$MODEL"
      --output_dir "$OUT/trl-async" --vllm_server_base_url "http://127.0.0.1:$PORT" --max_steps 3
      --per_device_train_batch_size 12 --gradient_accumulation_steps 1 --num_generations 4
      --max_completion_length 512 --replay_warmup_steps 1 --report_to none --save_strategy no)
    run_path trl-async-preflight "$OUT/trl-async-preflight.log" "$PY" -m grpo_replay.cli preflight accelerate launch \
      "${LAUNCH[@]}" || continue
    if [ "$NGPU" -lt 2 ]; then
      skip trl-async "needs 2 GPUs (the vLLM server's NCCL weight transfer refuses the trainer on its device)"
      continue
    fi
    start_server trl-async-server "$OUT/trl-async-server.log" env CUDA_VISIBLE_DEVICES=0 VLLM_SERVER_DEV_MODE=1 \
      "$PY" -m vllm.entrypoints.cli.main serve "$MODEL" --dtype float32 --max-model-len 4096 \
      --weight-transfer-config '{"backend":"nccl"}' --port "$PORT" \
      && run_path trl-async "$OUT/trl-async.log" env CUDA_VISIBLE_DEVICES=1 \
        "$PY" -m accelerate.commands.launch "${LAUNCH[@]}"
    rc=$?
    stop_server
    [ $rc -eq 0 ] && check_share trl-async "$OUT/trl-async" ;;
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
      trainer.val_before_train=false 'trainer.logger=["console","file"]')
    run_path verl-preflight "$OUT/verl-preflight.log" "$PY" -m grpo_replay.cli preflight "${LAUNCH[@]}" \
      && run_path verl "$OUT/verl.log" env PATH="$VERL_VENV/bin:$PATH" VERL_FILE_LOGGER_PATH="$OUT/verl-metrics.jsonl" \
        "${LAUNCH[@]}" \
      && check_share verl "$OUT/verl-metrics.jsonl" ;;
  esac
done
[ "$DRY" = 1 ] && exit 0
exit $(( FAILED ? 3 : 0 ))
