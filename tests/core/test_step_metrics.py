"""`step_row`: the one assembly of a step's replay metrics; `ReplayRecord`: the one `replay_history` entry."""
import json

import pytest
import torch

from grpo_replay import metric_names as mn
from grpo_replay.step_metrics import ReplayRecord, step_row
from grpo_replay.tally import Tally


def tally() -> Tally:
    t = Tally.of_values(torch.tensor([False, False, True, True]), torch.tensor([1.0, -3.0, 2.0, 0.5]), None,
                        torch.tensor([0, 0, 2, 3]))
    t.update(groups=4.0, zero_variance_groups=1.0)
    return t


def test_the_row_is_the_tally_then_the_insert_then_the_buffer():
    row = step_row(tally(), inserted=3, buffer={mn.BUFFER_SIZE: 9}, skipped_nonfinite=2)
    assert row == {**tally().metrics(), mn.REPLAY_INSERTED: 3, mn.BUFFER_SIZE: 9, mn.BUFFER_SKIPPED_NONFINITE: 2}
    assert row[mn.REPLAY_SHARE] == 0.5 and row[mn.ZERO_VARIANCE_SHARE] == 0.25 and row[mn.REPLAY_AGE_MAX] == 3
    assert mn.BUFFER_SKIPPED_NONFINITE not in step_row(tally())  # logged when rows were left out only
    assert mn.REPLAY_INSERTED not in step_row(tally())


def test_ages_in_policy_versions_go_under_their_own_names_and_lists_can_be_left_out():
    row = step_row(tally(), ages_in_versions=True)
    assert row[mn.REPLAY_AGE_VERSIONS_MEAN] == 2.5 and row[mn.REPLAY_AGE_VERSIONS_MAX] == 3
    assert not {mn.REPLAY_AGE_MEAN, mn.REPLAY_AGE_MAX, mn.REPLAY_AGE_HIST} & set(row)
    assert mn.REPLAY_AGE_HIST in step_row(tally()) and mn.REPLAY_AGE_HIST not in step_row(tally(), lists=False)


def test_a_record_has_every_key_and_its_public_part_is_json():
    r = ReplayRecord.of(step=4, fresh_rows=2, replay_rows=1, replay_birth_steps=[1], replay_ages=[3],
                        replay_completion_ids=[[5, 6]])
    assert set(r) == {"step", "version", "fresh_rows", "replay_rows", "inserted", "buffer_size", "replay_birth_steps",
                      "replay_ages", "replay_advantages", "fresh_advantages", "replay_completion_ids"}
    assert "replay_completion_ids" not in r.public() and json.loads(json.dumps(r.public()))["replay_ages"] == [3]
    with pytest.raises(TypeError, match="rows"):
        ReplayRecord.of(step=0, fresh_rows=0, replay_rows=0, replay_birth_steps=[], replay_ages=[], rows=0)
