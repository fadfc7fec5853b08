"""Rows without a payload: an integration that keeps the tokens elsewhere (verl's v1 store keeps them in
TransferQueue) stores zero-width rows, only the scalars the buffer samples on, and names each stored row by the
buffer's own insertion number (`buffer_seq`): the n-th row ever added is row n, through eviction and a reload."""
import numpy as np
import torch

from grpo_replay import ReplayBuffer, ReplayConfig
from grpo_replay.rollout import RolloutBatch


def payload_free(advantages, group_ids, step):
    n = len(advantages)
    none = torch.zeros(n, 0, dtype=torch.long)
    adv = torch.tensor(advantages, dtype=torch.float32)
    return RolloutBatch.fresh(prompt_ids=none, prompt_mask=none, completion_ids=none, completion_mask=none,
                              behaviour_logps=torch.zeros(n, 0), advantages=adv, rewards=(adv > 0).float(),
                              group_ids=torch.tensor(group_ids), group_std=torch.ones(n), step=step)


def live_seqs(buf):
    return sorted(buf.keys()[0].tolist())


def test_payload_free_rows_are_drawn_by_priority_and_keep_no_tokens():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None, replacement=False), seed=0)
    buf.add(payload_free([1.0, -1.0, 0.0, 0.0], [0, 0, 1, 1], step=1), 1, prompt_keys=[7, 7, 8, 8])
    out = buf.sample(4, 2)
    assert out.completion_ids.shape == (4, 0) and out.prompt_ids.shape == (4, 0)
    assert buf.storage.width == 0 and buf.storage.prompt_ids.shape[1] == 0  # no token arena grew
    assert sorted(out.buffer_seq.tolist()) == [0, 1, 2, 3]
    by_seq = dict(zip(out.buffer_seq.tolist(), out.advantages.tolist()))
    assert by_seq == {0: 1.0, 1: -1.0, 2: 0.0, 3: 0.0}  # each row's own scalars under its number
    # |A| priority: the zero-advantage rows weigh eps^alpha only, so a draw of 2 takes the two |A| = 1 rows
    assert sorted(buf.sample(2, 2).buffer_seq.tolist()) == [0, 1]


def test_the_nth_row_added_is_row_n_through_eviction_and_reload(tmp_path):
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=1), seed=0)
    for step in range(4):
        assert buf.next_seq == buf.total_added == 3 * step  # the number the next row gets
        buf.add(payload_free([1.0, -0.5, 0.5], [0, 0, 1], step=step), step)
        buf.evict(step)
    assert live_seqs(buf) == [6, 7, 8, 9, 10, 11]  # steps 2 and 3; steps 0 and 1 evicted by age
    buf.save(tmp_path / "b")
    back = ReplayBuffer.load(tmp_path / "b")
    assert live_seqs(back) == live_seqs(buf) and back.total_added == 12
    assert buf.sample(3, 3).buffer_seq.tolist() == back.sample(3, 3).buffer_seq.tolist()  # the same draw
    back.add(payload_free([1.0], [0], step=4), 4)
    assert live_seqs(back)[-1] == 12 and np.isin(back.sample(4, 4).buffer_seq.numpy(), live_seqs(back)).all()
