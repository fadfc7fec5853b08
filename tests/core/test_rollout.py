"""The rollout batch (rollout.py): the one padded concatenation."""
import pytest
import torch

from grpo_replay import RolloutBatch
from grpo_replay.rollout import cat_padded
from helpers import make_batch


def _concat_reference(batches):
    """Pad every part to the shared widths (prompts left, completions right), then cat."""
    P = max(b.prompt_ids.shape[1] for b in batches)
    C = max(b.completion_ids.shape[1] for b in batches)
    out = {}
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "behaviour_logps"):
        parts = []
        for b in batches:
            t = getattr(b, name)
            pad = (P - t.shape[1], 0) if name.startswith("prompt") else (0, C - t.shape[1])
            parts.append(torch.nn.functional.pad(t, pad))
        out[name] = torch.cat(parts)
    return out


@pytest.mark.parametrize("same_widths", [True, False])
def test_concat_pads_with_zeros_to_shared_widths(same_widths):
    a = make_batch(2, 2, seed=1, max_prompt=5, max_completion=7)
    if same_widths:  # the torch.cat path
        b = a.select(torch.tensor([3, 0, 1]))
        b.completion_ids = b.completion_ids + 100
    else:  # wider prompts, narrower completions: both kinds of padding
        b = make_batch(1, 3, seed=2, max_prompt=9, max_completion=3)
        assert b.prompt_ids.shape[1] > a.prompt_ids.shape[1] and b.completion_ids.shape[1] < a.completion_ids.shape[1]
    # garbage in the output buffer must not leak into padding: fill the allocator with non-zero memory first
    for _ in range(3):
        torch.full((64, 64), 7)
    out = RolloutBatch.concat([a, b])
    ref = _concat_reference([a, b])
    for name, t in ref.items():
        assert torch.equal(getattr(out, name), t), name
    assert torch.equal(out.advantages, torch.cat([a.advantages, b.advantages]))


def test_cat_padded_pads_with_a_value_to_a_multiple():
    a, b = torch.tensor([[1, 2, 3]]), torch.tensor([[4]])
    assert cat_padded([a, b], left=True, value=9).tolist() == [[1, 2, 3], [9, 9, 4]]
    assert cat_padded([a, b], left=False, value=0, multiple=4).tolist() == [[1, 2, 3, 0], [4, 0, 0, 0]]
    same = cat_padded([a, a], left=False)
    assert same.tolist() == [[1, 2, 3], [1, 2, 3]]
