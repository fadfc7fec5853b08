"""The helpers every adapter needs (adapter_rows.py): a prompt's key, a row's one advantage, rows as token tensors."""
import numpy as np
import pytest
import torch

from grpo_replay import RolloutBatch
from grpo_replay.adapter_rows import TOKEN_KEYS, prompt_key, row_advantages, token_rows


def test_a_prompt_key_is_the_same_for_every_integer_form_and_across_versions():
    ids = [151644, 872, 198]
    forms = [np.array(ids), np.array(ids, dtype=np.int32), torch.tensor(ids), torch.tensor(ids, dtype=torch.int32)]
    assert len({prompt_key(f) for f in forms}) == 1
    # the value a saved buffer holds in its prompt_key column: a resumed run must compute the same
    assert prompt_key(np.array([1, 2, 3])) == 3817744674624027255
    assert prompt_key(np.array(ids)) == 1855700983335460597
    assert prompt_key(np.array([1, 2, 3])) != prompt_key(np.array([3, 2, 1]))
    assert 0 <= prompt_key(np.array([], dtype=np.int64)) < 2**63


def test_row_advantages_take_the_broadcast_value_exactly():
    a = torch.tensor([0.123456789, -2.5, 7.0])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])  # the last row counts no token
    tokens = a[:, None] * torch.ones(3, 4)
    tokens[0, 0] = 99.0  # a position the mask leaves out is never read
    out = row_advantages(tokens, mask)
    assert out.dtype == torch.float32 and out.tolist() == [a[0].item(), -2.5, 0.0]
    assert row_advantages(torch.zeros(2, 0), torch.zeros(2, 0)).tolist() == [0.0, 0.0]


def test_row_advantages_refuse_rows_whose_advantages_vary_over_their_tokens():
    tokens = torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.4, 0.3], [2.0, 2.0, 2.0 + 1e-6]])
    with pytest.raises(ValueError, match=r"rows \[1\]: replay stores one advantage per rollout .*outcome estimators"):
        row_advantages(tokens, torch.ones(3, 3))
    # the variation sits under mask 0: nothing to refuse
    assert row_advantages(tokens, torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 1]])).tolist() == pytest.approx(
        [1.0, 0.5, 2.0])


def _rows() -> RolloutBatch:
    return RolloutBatch.fresh(
        prompt_ids=torch.tensor([[0, 5, 6], [7, 8, 9]], dtype=torch.int32),
        prompt_mask=torch.tensor([[False, True, True], [True, True, True]]),
        completion_ids=torch.tensor([[11, 12, 13, 14], [15, 16, 17, 18]], dtype=torch.int32),
        # row 0: a tool token (mask 0) inside the completion, then padding; row 1: two tokens
        completion_mask=torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0]]),
        behaviour_logps=torch.zeros(2, 4), advantages=torch.zeros(2), rewards=torch.zeros(2),
        group_ids=torch.zeros(2, dtype=torch.long), group_std=torch.ones(2), step=0)


def test_token_rows_pad_with_the_pad_id_and_attend_over_each_rows_length():
    out = token_rows(_rows(), pad_id=-7)
    assert tuple(out) == TOKEN_KEYS and all(v.dtype == torch.long for v in out.values())
    assert out["prompt_ids"].tolist() == [[-7, 5, 6], [7, 8, 9]]
    assert out["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert out["completion_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]  # the tool token is attended to
    assert out["completion_ids"].tolist() == [[11, 12, 13, -7], [15, 16, -7, -7]]
    assert token_rows(_rows(), None)["completion_ids"].tolist() == [[11, 12, 13, 0], [15, 16, 0, 0]]
