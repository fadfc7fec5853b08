import pytest

from grpo_replay import AGGREGATIONS, COMPOSITIONS, PRIORITIES
from grpo_replay.registry import Registry


def test_duplicate_name_raises():
    r = Registry("thing", params=())
    r.register("a")(lambda: 1)
    with pytest.raises(ValueError, match="duplicate thing name 'a'"):
        r.register("a")(lambda: 2)


def test_unknown_name_lists_allowed():
    with pytest.raises(ValueError, match="unknown priority 'x'; allowed: .*abs_advantage"):
        PRIORITIES.get("x")


def test_the_papers_names_are_registered():
    """The method's and its baselines' names (docs/method.md); other entries may be registered besides."""
    assert {"abs_advantage", "group_std", "uniform"} <= set(PRIORITIES.names())
    assert {"fresh_anchored", "pool"} <= set(COMPOSITIONS.names())
    assert {"token_mean"} <= set(AGGREGATIONS.names())


@pytest.mark.parametrize("registry, arity", [(PRIORITIES, 2), (COMPOSITIONS, 4), (AGGREGATIONS, 3)])
def test_every_registry_declares_its_signature_and_refuses_another(registry, arity):
    """A registered function with the wrong number of parameters fails at registration, not at its first call."""
    assert len(registry.params) == arity
    with pytest.raises(TypeError, match=f"every {registry.kind} takes"):
        registry.register("wrong_arity_probe")(lambda x: x)
    assert "wrong_arity_probe" not in registry
