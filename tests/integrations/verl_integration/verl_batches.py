"""Synthetic verl batches shaped like verl 0.9.1's at `RayPPOTrainer._update_actor`.

Layout follows `agent_loop._postprocess` + `ray_trainer.fit`: left-padded `prompts`, right-padded `responses`,
`input_ids`/`attention_mask`/`position_ids` over both, `response_mask`, `rollout_log_probs`, `old_log_probs`,
`token_level_scores`/`token_level_rewards` (reward on the last response token), and `advantages`/`returns`
computed by verl's own `compute_grpo_outcome_advantage` over a fresh uuid per prompt. verl is imported lazily
(each test module calls pytest.importorskip first), so the folder is skipped cleanly without verl.
"""
from __future__ import annotations

import uuid

import numpy as np
import torch

# A fixed pool of prompts: the same prompt comes back at later steps (under a new uid), as in a real run.
PROMPT_POOL = [list(range(10 + 7 * i, 10 + 7 * i + 2 + (i % 5))) for i in range(64)]


def make_batch(
    step: int,
    n_prompts: int = 8,
    n: int = 4,
    P: int = 8,
    R: int = 6,
    seed: int | None = None,
    rewards: np.ndarray | None = None,
    prompt_ids: list[int] | None = None,
    with_ref: bool = False,
    extra_tensor_keys: bool = True,
):
    """A fresh batch of n_prompts * n rows at global step `step` (rows of a group are adjacent)."""
    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    g = np.random.default_rng(step * 1000 + (seed or 0))
    tg = torch.Generator().manual_seed(step * 1000 + (seed or 0))  # the batch is a function of (step, seed)
    B = n_prompts * n
    if prompt_ids is None:
        prompt_ids = g.choice(len(PROMPT_POOL), size=n_prompts, replace=False).tolist()
    if rewards is None:
        rewards = (g.random(B) < 0.4).astype(np.float32)
    prompts = torch.zeros(B, P, dtype=torch.long)
    pmask = torch.zeros(B, P, dtype=torch.long)
    responses = torch.zeros(B, R, dtype=torch.long)
    rmask = torch.zeros(B, R, dtype=torch.long)
    uids = []
    for j, pid in enumerate(prompt_ids):
        toks = PROMPT_POOL[pid][:P]
        u = str(uuid.uuid4())
        for k in range(n):
            i = j * n + k
            prompts[i, P - len(toks) :] = torch.tensor(toks)
            pmask[i, P - len(toks) :] = 1
            c = int(g.integers(1, R + 1))
            responses[i, :c] = torch.from_numpy(g.integers(3, 50, size=c))
            rmask[i, :c] = 1
            uids.append(u)
    attention = torch.cat([pmask, rmask], 1)
    clen = rmask.sum(1)
    scores = torch.zeros(B, R)
    scores[torch.arange(B), clen - 1] = torch.from_numpy(np.asarray(rewards, dtype=np.float32))
    old = -torch.rand(B, R, generator=tg) * rmask
    uid_arr = np.array(uids, dtype=object)
    adv, ret = compute_grpo_outcome_advantage(scores, rmask.float(), index=uid_arr)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": rmask,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention,
        "position_ids": torch.clip(torch.cumsum(attention, -1) - 1, min=0),
        "old_log_probs": old,
        "token_level_scores": scores,
        "token_level_rewards": scores,
        "advantages": adv,
        "returns": ret,
    }
    if extra_tensor_keys:
        tensors["rollout_log_probs"] = old + 0.01 * rmask
        tensors["rm_scores"] = scores.clone()
    if with_ref:
        tensors["ref_log_prob"] = -torch.rand(B, R, generator=tg) * rmask
    non_tensors = {
        "uid": uid_arr,
        "data_source": np.array(["synthetic"] * B, dtype=object),
        "raw_prompt": np.array([f"p{pid}" for pid in prompt_ids for _ in range(n)], dtype=object),
        "__num_turns__": np.full(B, 2, dtype=np.int32),
        "extras": np.array([None] * B, dtype=object),
    }
    meta = {
        "temperature": 1.0,
        "metrics": [{"generate_sequences": 0.1} for _ in range(B)],
        "global_token_num": attention.sum(-1).tolist(),
        "images_seqlens": [],
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def v1_row(p: int, r: int, adv: float = -0.75, seed: int = 0, mask=None, vocab: int = 151_000) -> dict:
    """One row as verl 0.9.1's v1 pipeline leaves it in TransferQueue before the actor update (a text agent
    loop, GRPO, rollout log-probs from the engine, old log-probs from the actor; no attention_mask: verl's real
    rows have none, only its padding rows). P prompt, R response tokens; `mask`: the (R,) response mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (p + r,), generator=g)
    response_mask = torch.ones(r, dtype=torch.int64) if mask is None else mask
    lp = -torch.rand(r, generator=g) * 3
    scores = torch.zeros(r)
    scores[-1] = 1.0
    return {
        "prompts": ids[:p].clone(), "responses": ids[p:].clone(), "input_ids": ids,
        "position_ids": torch.arange(p + r), "response_mask": response_mask, "loss_mask": response_mask.clone(),
        "rollout_log_probs": lp + 0.01, "old_log_probs": lp,
        "log_probs": torch.cat([torch.zeros(p), lp]), "entropy": torch.rand(r, generator=g),
        "dummy_tensor": torch.zeros(1, dtype=torch.uint8), "multi_modal_inputs": {},
        "rm_scores": scores, "token_level_scores": scores, "token_level_rewards": scores,
        "advantages": adv * response_mask.float(), "returns": adv * response_mask.float(),
        "uid": "3f2a", "num_turns": 2, "raw_prompt": [{"role": "user", "content": "x"}],
        "extra_fields": {"min_global_steps": 3, "reward_extra_info": {"acc": 1.0}},
    }
