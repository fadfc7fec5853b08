from pathlib import Path

import pytest
import yaml

from grpo_replay import PRESETS, ReplayConfig
from grpo_replay.app.configio import field_docs


def test_defaults_are_the_papers():
    c = ReplayConfig()
    assert (c.tau_max, c.replay_ratio, c.alpha, c.eps) == (10, 0.5, 0.5, 1e-6)
    assert (c.priority, c.composition, c.granularity) == ("abs_advantage", "fresh_anchored", "rollout")
    assert (c.warmup_steps, c.capacity, c.replacement) == (20, 30_000, False)
    assert ReplayConfig.paper() == c


def test_presets():
    assert not ReplayConfig.grpo().enabled
    u = ReplayConfig.uniform_pool()
    assert (u.priority, u.composition, u.granularity) == ("uniform", "pool", "group")
    s = ReplayConfig.sigma_pool()
    assert (s.priority, s.composition, s.granularity) == ("group_std", "pool", "group")
    for name in PRESETS:
        assert ReplayConfig.from_preset(name) == getattr(ReplayConfig, name)()
    assert ReplayConfig.from_preset("paper", tau_max=3).tau_max == 3


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("tau_max", -1, "integer >= 0"),
        ("replay_ratio", -0.1, ">= 0"),
        ("alpha", -1.0, ">= 0"),
        ("eps", 0.0, "> 0"),
        ("priority", "td_error", "abs_advantage, group_std, uniform"),
        ("composition", "mix", "fresh_anchored, pool"),
        ("granularity", "token", "rollout, group"),
        ("warmup_steps", -2, ">= 0"),
        ("capacity", 0, ">= 1"),
        ("replacement", "yes", "true or false"),
        ("tau_max", 2.5, "integer"),
    ],
)
def test_invalid_config_names_field_and_allowed(field, value, allowed):
    with pytest.raises(ValueError) as e:
        ReplayConfig(**{field: value})
    assert f"ReplayConfig.{field}" in str(e.value) and allowed in str(e.value)


def test_unknown_preset():
    with pytest.raises(ValueError, match="allowed: paper, grpo, uniform_pool, sigma_pool"):
        ReplayConfig.from_preset("best")


VERL_REPLAY_GROUP = Path(__file__).resolve().parents[2] / "src/grpo_replay/integrations/verl/config/replay"


@pytest.mark.parametrize("preset", PRESETS)
def test_verl_replay_group_matches_replay_config(preset):
    """The verl Hydra group is generated from ReplayConfig (integrations/verl/replay_group.py, run in the verl
    environment); this checks, without verl, that a changed core field, default, preset or docstring was regenerated."""
    path = VERL_REPLAY_GROUP / f"{preset}.yaml"
    values = yaml.safe_load(path.read_text())
    core = {k: values[k] for k in values if k in ReplayConfig.__dataclass_fields__}
    assert values["preset"] == preset
    assert core == ReplayConfig.from_preset(preset).to_dict(), f"regenerate {path} (python -m grpo_replay.integrations.verl.replay_group)"
    comments, docs = {}, field_docs(ReplayConfig)
    block: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            block.append(line[2:])
        elif line and not line.startswith("#"):
            comments[line.split(":")[0]] = " ".join(block)
            block = []
    assert {k: comments[k] for k in core} == {k: docs[k] for k in core}


# --- the options beyond the paper -----------------------------------------------------------------------
@pytest.mark.parametrize("field,value,allowed", [
    ("max_drift", 0.0, "a finite number > 0 or None"), ("max_drift", -1.0, "a finite number > 0 or None"),
    ("max_drift", "0.1", "a finite number > 0 or None"), ("max_drift", float("nan"), "a finite number > 0 or None"),
    ("fill_filtered", 1, "true or false"), ("fill_filtered", "yes", "true or false"),
    ("max_uses", 0, "an integer >= 1 or None"), ("max_uses", 2.0, "an integer >= 1 or None"),
    ("max_uses", True, "an integer >= 1 or None"),
    ("age_decay", 0, "a finite number > 0 or None"), ("age_decay", float("inf"), "a finite number > 0 or None"),
])
def test_options_are_validated_naming_the_field_and_allowed_values(field, value, allowed):
    with pytest.raises(ValueError, match=rf"ReplayConfig\.{field}=.* is invalid; allowed: {allowed}"):
        ReplayConfig(**{field: value})


def test_fill_filtered_is_refused_where_it_cannot_take_effect():
    with pytest.raises(ValueError, match=r"ReplayConfig\.fill_filtered=True is invalid; allowed: false with composition='pool'"):
        ReplayConfig.uniform_pool(fill_filtered=True)
    with pytest.raises(ValueError, match=r"ReplayConfig\.fill_filtered=True is invalid; allowed: false with replay_ratio=0"):
        ReplayConfig.grpo(fill_filtered=True)
    assert ReplayConfig(fill_filtered=True).fill_filtered


def test_options_default_off_in_every_preset():
    for preset in PRESETS:
        c = ReplayConfig.from_preset(preset)
        assert (c.max_drift, c.fill_filtered, c.max_uses, c.age_decay) == (None, False, None, None)


def test_engines_without_the_options_refuse_them():
    from grpo_replay.config import refuse_options

    refuse_options(ReplayConfig(), "X")  # the defaults pass
    with pytest.raises(ValueError, match=r"ReplayConfig\.max_uses=2 is invalid; allowed: None \(the X integration"):
        refuse_options(ReplayConfig(max_uses=2), "X")
