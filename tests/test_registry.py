import pytest

from grpo_replay import AGGREGATIONS, COMPOSITIONS, PRIORITIES
from grpo_replay.registry import Registry


def test_duplicate_name_raises():
    r = Registry("thing")
    r.register("a")(lambda: 1)
    with pytest.raises(ValueError, match="duplicate thing name 'a'"):
        r.register("a")(lambda: 2)


def test_unknown_name_lists_allowed():
    with pytest.raises(ValueError, match="unknown priority 'x'; allowed: abs_advantage, group_std, uniform"):
        PRIORITIES.get("x")
    assert COMPOSITIONS.names() == ["fresh_anchored", "pool"]
    assert AGGREGATIONS.names() == ["dr_grpo", "seq_mean", "token_mean"]
