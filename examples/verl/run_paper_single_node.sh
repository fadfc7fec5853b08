#!/usr/bin/env bash
# grpo-replay on verl 0.9.1, the paper's setting (docs/method.md): Qwen3 base model, math prompts with a binary
# verifiable reward, G=8 rollouts per prompt, PPO-clip with clip-higher (0.2/0.28), dual-clip c=10, token-mean,
# one optimizer step per batch, no KL, lr 1e-6; replay: tau_max=10, fresh-anchored, |A_i| priority (replay=paper).
# Single node, 8 GPUs, vLLM rollouts. NOT run in this repository's CI (needs GPUs); see docs/verl.md.
#
# Trainer: verl's default v1 trainer (TRAINER=v1) in MODE=sync (default) or MODE=colocate_async, or the legacy
# RayPPOTrainer (TRAINER=legacy, i.e. trainer.use_v1=false). On v1 the stored rollouts live in TransferQueue's
# storage units; its total_storage_size (verl default 100000 rows) must hold replay.capacity rows plus the rows
# in flight (checked at launch). In colocate_async / separate_async replay rows are also bounded by verl's
# trainer.v1.sampler.max_off_policy_threshold: age <= threshold - 1 (verl's default 8 -> 7 < tau_max=10; the bound
# in force is printed at launch).
#
# Environment: a GPU machine with verl's GPU extras, made by `bash scripts/setup_verl_gpu.sh` (.venv-verl-gpu:
# torch 2.11.0 first, flash-attn 2.8.3 built with --no-build-isolation, verl[vllm,fsdp]==0.9.1, this project; a
# plain `pip install "verl[vllm,fsdp]==0.9.1"` fails building flash-attn). Run with that env's python first on PATH:
#   PATH=$PWD/.venv-verl-gpu/bin:$PATH bash examples/verl/run_paper_single_node.sh
# Data: verl's examples/data_preprocess/math_dataset.py (verl repository) writes $DATA/{train,test}.parquet.
#
# Seeds: SEED sets every seed of the run: the prompt order (data.seed; verl's null is one fixed order), vLLM's
# sampling (actor_rollout_ref.rollout.seed), the update's mini-batch shuffle (actor.data_loader_seed), the actor's
# FSDP seed and the replay draw (replay.seed). The arms of one SEED share them (paired by seed), seeds differ.
# Checkpoints: one folder per run, CKPT_ROOT/<trainer.experiment_name> (EXP, naming the model, preset, trainer, mode
# and seed, unless an override names the experiment). verl's
# trainer.resume_mode=auto resumes the latest global_step_* in that folder: a rerun of the same run continues it, a
# new arm or seed starts fresh in a folder of its own. The entry point prints which before Ray starts, and refuses a
# folder whose checkpoints another preset, seed or model wrote (grpo_replay/integrations/verl/run_folder.py).
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen3-4B-Base}
DATA=${DATA:-$HOME/data/math}
PRESET=${PRESET:-paper}           # paper | grpo | uniform_pool | sigma_pool (the paper's arms)
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}
PROMPTS=${PROMPTS:-128}           # prompts per step; rows per step = PROMPTS * 8
TRAINER=${TRAINER:-v1}            # v1 | legacy
MODE=${MODE:-sync}                # v1 only: sync | colocate_async | separate_async
SEED=${SEED:-0}                   # every seed of the run (above)
EXP=${EXP:-$(basename "$MODEL" | tr "[:upper:]" "[:lower:]")-math-replay-$PRESET-$TRAINER-$MODE-s$SEED}
CKPT_ROOT=${CKPT_ROOT:-checkpoints/grpo-replay}   # verl's default parent (checkpoints/<project_name>)
if [ "$TRAINER" = legacy ]; then
  TRAINER_ARGS=(trainer.use_v1=false)
else
  TRAINER_ARGS=(trainer.use_v1=true trainer.v1.trainer_mode="$MODE")
fi
MINI=$PROMPTS                     # one optimizer step per batch (the paper's setting)
if [ "$MODE" = separate_async ]; then
  # verl: train_batch_size = parameter_sync_step * ppo_mini_batch_size; rollout on ROLLOUT_GPUS GPUs of their own
  SYNC_STEPS=${SYNC_STEPS:-1} ROLLOUT_GPUS=${ROLLOUT_GPUS:-4}
  MINI=$(( PROMPTS / SYNC_STEPS ))
  N_GPUS=$(( N_GPUS - ROLLOUT_GPUS ))
  TRAINER_ARGS+=(trainer.v1.separate_async.parameter_sync_step="$SYNC_STEPS"
                 actor_rollout_ref.rollout.nnodes=1 actor_rollout_ref.rollout.n_gpus_per_node="$ROLLOUT_GPUS"
                 actor_rollout_ref.rollout.checkpoint_engine.backend=nccl)
fi

python -m grpo_replay.integrations.verl.main \
  replay="$PRESET" \
  replay.seed="$SEED" \
  data.seed="$SEED" \
  actor_rollout_ref.rollout.seed="$SEED" \
  actor_rollout_ref.actor.data_loader_seed="$SEED" \
  actor_rollout_ref.actor.fsdp_config.seed="$SEED" \
  "${TRAINER_ARGS[@]}" \
  algorithm.adv_estimator=grpo \
  algorithm.use_kl_in_reward=false \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size="$PROMPTS" \
  data.max_prompt_length=1024 \
  data.max_response_length=4096 \
  data.filter_overlong_prompts=true \
  data.truncation=error \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size="$MINI" \
  actor_rollout_ref.actor.ppo_epochs=1 \
  actor_rollout_ref.actor.use_dynamic_bsz=true \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576 \
  actor_rollout_ref.actor.clip_ratio_low=0.2 \
  actor_rollout_ref.actor.clip_ratio_high=0.28 \
  actor_rollout_ref.actor.clip_ratio_c=10.0 \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.use_kl_loss=false \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true \
  trainer.n_gpus_per_node="$N_GPUS" \
  trainer.nnodes="$NNODES" \
  trainer.balance_batch=true \
  trainer.critic_warmup=0 \
  trainer.save_freq=20 \
  trainer.test_freq=20 \
  trainer.max_actor_ckpt_to_keep=2 \
  trainer.logger='["console"]' \
  trainer.project_name=grpo-replay \
  trainer.experiment_name="$EXP" \
  trainer.default_local_dir="$CKPT_ROOT/\${trainer.experiment_name}" \
  trainer.total_epochs=10 \
  "$@"
