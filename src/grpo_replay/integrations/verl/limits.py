"""verl 0.9.1's length and micro-batch limits that it meets only once training runs, checked on the config before
Ray starts. Each is a ValueError naming the field and the allowed values.

- vLLM generates at most `rollout.max_model_len` minus the prompt's tokens (vllm_async_server clamps `max_tokens`
  without a word): a `max_model_len` below max prompt + max response silently shortens answers.
- With dynamic batch sizes, `rearrange_micro_batches` asserts that a micro-batch's token cap (the
  `*_max_token_len_per_gpu` times the Ulysses sequence-parallel size) holds the longest sequence: at the first
  long answer, possibly hours in.
- The engine worker asserts that the actor's and the old-log-prob pass's dynamic batch settings agree and, without
  them, that both micro-batch sizes are set; `prepare_micro_batches` asserts that a GPU's share of a mini-batch
  splits into whole micro-batches.
"""
from __future__ import annotations

from typing import Any

from .v1_checks import _get

ACTOR, ROLLOUT, REF = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"


def sequence_tokens(config: Any) -> int:
    """The longest sequence verl trains on: the rollout's prompt length plus its response length (by default
    `data.max_prompt_length` + `data.max_response_length`)."""
    return int(_get(config, f"{ROLLOUT}.prompt_length")) + int(_get(config, f"{ROLLOUT}.response_length"))


def _sp(config: Any) -> int:
    return int(_get(config, f"{ACTOR}.fsdp_config.ulysses_sequence_parallel_size", 1) or 1)


def update_tokens_per_gpu(config: Any) -> tuple[int, str]:
    """(tokens of one update micro-batch on a GPU, how they are counted): the dynamic cap, or the static
    micro-batch's rows times the longest sequence (a static micro-batch is sized by rows, not tokens)."""
    if _get(config, f"{ACTOR}.use_dynamic_bsz", False):
        cap = int(_get(config, f"{ACTOR}.ppo_max_token_len_per_gpu")) * _sp(config)
        return cap, f"{ACTOR}.ppo_max_token_len_per_gpu (dynamic batch size)"
    rows = int(_get(config, f"{ACTOR}.ppo_micro_batch_size_per_gpu") or 0)
    return rows * sequence_tokens(config), (f"{ACTOR}.ppo_micro_batch_size_per_gpu={rows} rows x "
                                            f"{sequence_tokens(config)} (max prompt + max response)")


def check_limits(config: Any) -> None:
    """Refuse what verl 0.9.1 would break on, or silently change, once it runs (see the module docstring)."""
    longest = sequence_tokens(config)
    lengths = "data.max_prompt_length + data.max_response_length"
    limit = _get(config, f"{ROLLOUT}.max_model_len")
    if limit is not None and int(limit) < longest:
        raise ValueError(
            f"{ROLLOUT}.max_model_len={limit} is below {lengths} = {longest}: vLLM stops every answer at "
            f"max_model_len minus its prompt's tokens, so answers are silently shorter than "
            f"data.max_response_length; allowed: max_model_len >= {longest}, or null (the model's own)")
    dynamic = bool(_get(config, f"{ACTOR}.use_dynamic_bsz", False))
    if dynamic != bool(_get(config, f"{ROLLOUT}.log_prob_use_dynamic_bsz", dynamic)):
        raise ValueError(
            f"{ROLLOUT}.log_prob_use_dynamic_bsz={not dynamic} differs from {ACTOR}.use_dynamic_bsz={dynamic}: "
            f"verl's engine worker asserts they agree when it starts; allowed: both {dynamic}, or leave "
            f"log_prob_use_dynamic_bsz unset (it follows the actor's)")
    caps = [(f"{ACTOR}.use_dynamic_bsz", f"{ACTOR}.ppo_max_token_len_per_gpu"),
            (f"{ROLLOUT}.log_prob_use_dynamic_bsz", f"{ROLLOUT}.log_prob_max_token_len_per_gpu")]
    if _get(config, "algorithm.use_kl_in_reward", False) or _get(config, f"{ACTOR}.use_kl_loss", False):
        caps.append((f"{REF}.log_prob_use_dynamic_bsz", f"{REF}.log_prob_max_token_len_per_gpu"))
    short = [(key, _get(config, key)) for switch, key in caps if _get(config, switch, False)
             and _get(config, key) is not None and int(_get(config, key)) * _sp(config) < longest]
    if short:
        raise ValueError(
            f"{' and '.join(f'{k}={v}' for k, v in short)} (x Ulysses size {_sp(config)}) below {lengths} = "
            f"{longest}: with dynamic batch sizes verl asserts that a micro-batch holds the longest sequence, and "
            f"stops at the first answer that long; allowed: {' and '.join(k for k, _ in short)} >= "
            f"{-(-longest // _sp(config))}")
    if not dynamic:
        _check_static(config)
    _check_separate_async(config)
    check_batch_unit(config)


def _check_separate_async(config: Any) -> None:
    """verl's separate_async trainer asserts, when it starts, that a step's batch is parameter_sync_step
    mini-batches."""
    if not _get(config, "trainer.use_v1", True) or _get(config, "trainer.v1.trainer_mode") != "separate_async":
        return
    key = "trainer.v1.separate_async.parameter_sync_step"
    steps, mini = int(_get(config, key, 1)), int(_get(config, f"{ACTOR}.ppo_mini_batch_size"))
    prompts = int(_get(config, "data.train_batch_size"))
    if prompts != steps * mini:
        raise ValueError(
            f"{key}={steps}: data.train_batch_size={prompts} is not parameter_sync_step x {ACTOR}."
            f"ppo_mini_batch_size = {steps} x {mini}, which verl's separate_async trainer asserts when it starts; "
            f"allowed: a parameter_sync_step that divides train_batch_size, with ppo_mini_batch_size = "
            f"train_batch_size / parameter_sync_step (the launchers: PROMPTS a multiple of SYNC_STEPS)")


def _check_static(config: Any) -> None:
    """Static micro-batches: both sizes set, and a GPU's share of a mini-batch a whole number of them."""
    unset = [key for key in (f"{ACTOR}.ppo_micro_batch_size_per_gpu", f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu")
             if _get(config, key) is None and _get(config, key.replace("_per_gpu", "")) is None]
    if unset:
        raise ValueError(
            f"{unset[0]} is unset with {ACTOR}.use_dynamic_bsz=false: verl's worker asserts that "
            f"{' and '.join(unset)} are set; allowed: rows per micro-batch for each (e.g. "
            f"{' '.join(k + '=4' for k in unset)}), or {ACTOR}.use_dynamic_bsz=true with a token cap")


def check_batch_unit(config: Any) -> None:
    """The replay trainer's own batch unit (`sizing.batch_unit`, which it computes at its first update) over
    the launch's GPUs: a GPU's share of each PPO mini-batch must split into whole micro-batches."""
    from .settings import replay_dict, split_config
    from .sizing import batch_unit, micro_batch_rows

    n = int(_get(config, f"{ROLLOUT}.n", 1))
    mini = int(_get(config, f"{ACTOR}.ppo_mini_batch_size"))
    rows = int(_get(config, "data.train_batch_size")) * n
    if _get(config, "trainer.v1.trainer_mode") == "separate_async" and _get(config, "trainer.use_v1", True):
        rows = mini * n  # each step samples train_batch_size / parameter_sync_step prompts
    gpus = int(_get(config, "trainer.n_gpus_per_node", 1)) * int(_get(config, "trainer.nnodes", 1))
    dp = max(1, gpus // _sp(config))
    micro = micro_batch_rows(_get(config, ACTOR))
    keep = split_config(replay_dict(config))[1].keep_optimizer_steps
    try:
        batch_unit(rows, mini * n, dp, micro, n, keep)
    except ValueError as e:
        key = f"{ACTOR}.ppo_micro_batch_size_per_gpu={micro}" if micro > 1 else f"{ACTOR}.ppo_mini_batch_size={mini}"
        raise ValueError(
            f"{key}: {e}, over trainer.n_gpus_per_node x trainer.nnodes / Ulysses size = {dp} data-parallel GPUs "
            f"(data.train_batch_size x rollout.n = {rows} rows a step); the update cannot split it, and verl's "
            f"worker asserts at the first update; allowed: ppo_mini_batch_size x rollout.n = {mini * n} rows that "
            f"divide the step's rows and split over the {dp} GPUs into micro-batches of {micro} row(s) (e.g. "
            f"fewer rows per micro-batch, or GPUs that divide the mini-batch)") from None
