"""Bad numbers and shapes at the core API: each fails early with a ValueError
that names the field, never a NaN update, a bare TypeError or a raw torch indexing error."""
import dataclasses
import math

import pytest
import torch

from grpo_replay import LossConfig, ReplayBuffer, ReplayConfig, RolloutBatch, group_advantages, nonzero_variance_mask
from grpo_replay.errors import ConfigError
from grpo_replay.trainer.train_config import resolve
from helpers import make_batch

NON_FINITE = [math.nan, math.inf, -math.inf]


def _float_fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if "float" in str(f.type)]


def test_every_float_field_is_listed():
    # If a float field is added, the parametrisations below must cover it (they are built from these lists).
    assert set(_float_fields(ReplayConfig)) == {"replay_ratio", "alpha", "eps", "max_drift", "age_decay"}
    assert set(_float_fields(LossConfig)) == {"eps_low", "eps_high", "dual_clip_c", "beta"}


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("cls,name", [(ReplayConfig, n) for n in _float_fields(ReplayConfig)] + [(LossConfig, n) for n in _float_fields(LossConfig)])
def test_non_finite_floats_are_rejected_naming_the_field(cls, name, value):
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{name}=(nan|inf|-inf) is invalid; allowed: a finite number"):
        cls(**{name: value})


@pytest.mark.parametrize("cls,name", [(LossConfig, "eps_high"), (LossConfig, "eps_low"), (LossConfig, "beta"),
                                      (LossConfig, "dual_clip_c"), (LossConfig, "max_completion_length"),
                                      (ReplayConfig, "replay_ratio"), (ReplayConfig, "alpha"), (ReplayConfig, "eps")])
def test_a_string_gives_a_value_error_naming_the_field(cls, name):
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{name}='x' is invalid"):
        cls(**{name: "x"})


@pytest.mark.parametrize("key,value", [("replay.replay_ratio", math.inf), ("replay.alpha", math.nan), ("replay.eps", math.inf),
                                       ("loss.eps_high", math.nan), ("loss.beta", math.inf), ("loss.dual_clip_c", math.nan)])
def test_train_config_rejects_non_finite_replay_and_loss_fields(key, value):
    with pytest.raises(ConfigError, match=rf"\.{key.split('.')[1]}=(nan|inf) is invalid"):
        resolve({key: value})


def test_trl_config_rejects_non_finite_replay_fields(tmp_path):
    pytest.importorskip("trl")
    from grpo_replay.integrations.trl import ReplayGRPOConfig

    for kw in ({"replay_ratio": math.inf}, {"replay_alpha": math.nan}, {"beta": math.nan}, {"epsilon_high": math.inf},
               {"epsilon": -math.inf}):
        name = "ReplayConfig" if next(iter(kw)).startswith("replay") else "ReplayGRPOConfig"
        with pytest.raises(ValueError, match=rf"{name}\..*is invalid; allowed: a finite number"):
            ReplayGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **kw)


def test_trl_configs_take_the_replay_options(tmp_path):
    pytest.importorskip("trl")
    from grpo_replay.integrations.trl import ReplayAsyncGRPOConfig, ReplayGRPOConfig

    for cls in (ReplayGRPOConfig, ReplayAsyncGRPOConfig):
        for field, value in (("fill_filtered", True), ("max_uses", 2), ("age_decay", 3.0), ("max_drift", 0.5)):
            c = cls(output_dir=str(tmp_path), use_cpu=True, bf16=False, **{f"replay_{field}": value})
            assert getattr(c.to_replay_config(), field) == value
        with pytest.raises(ValueError, match=r"ReplayConfig\.max_drift=0\.0 is invalid"):
            cls(output_dir=str(tmp_path), use_cpu=True, bf16=False, replay_max_drift=0.0)


# --- non-finite rewards -----------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [group_advantages, nonzero_variance_mask])
@pytest.mark.parametrize("bad", NON_FINITE)
def test_non_finite_rewards_are_an_error_in_the_core_helpers(fn, bad):
    r = torch.tensor([1.0, 0.0, bad, 1.0, 0.0, 1.0])
    gid = torch.tensor([0, 0, 0, 1, 1, 1])
    with pytest.raises(ValueError, match=r"rewards must be finite; 1 are NaN or inf \(rows \[2\]\)"):
        fn(r, gid)


# --- shapes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [group_advantages, nonzero_variance_mask])
@pytest.mark.parametrize(
    "rewards,gids",
    [
        (torch.zeros(6), torch.zeros(5, dtype=torch.long)),  # lengths differ
        (torch.zeros(6, 1), torch.zeros(6, dtype=torch.long)),  # 2-D rewards
        (torch.zeros(6), torch.zeros(6, 1, dtype=torch.long)),
        (torch.tensor(1.0), torch.tensor(0)),  # 0-D
    ],
)
def test_wrong_reward_shapes_get_a_clear_error(fn, rewards, gids):
    with pytest.raises(ValueError, match="rewards and group_ids must be 1-D of the same length"):
        fn(rewards, gids)


def test_float_group_ids_and_non_tensors_are_rejected():
    with pytest.raises(ValueError, match="group_ids must be an integer tensor"):
        group_advantages(torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError, match="must be torch tensors"):
        nonzero_variance_mask([1.0, 0.0], torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize(
    "field,shape",
    [("rewards", (8, 1)), ("advantages", (8, 2)), ("group_ids", ()), ("is_replay", (8, 1)), ("completion_mask", (8,)),
     ("behaviour_logps", (8, 3, 1))],
)
def test_rollout_batch_rejects_wrong_dimensions(field, shape):
    b = make_batch(2, 4)
    kw = {f.name: getattr(b, f.name) for f in dataclasses.fields(b)}
    kw[field] = torch.zeros(shape, dtype=kw[field].dtype)
    with pytest.raises(ValueError, match=rf"RolloutBatch\.{field} must be [12]-D"):
        RolloutBatch(**kw)


def test_rollout_batch_rejects_a_non_tensor():
    b = make_batch(1, 2)
    with pytest.raises(ValueError, match="RolloutBatch.rewards must be a torch.Tensor, got list"):
        dataclasses.replace(b, rewards=[0.0, 1.0])


# --- token ids beyond int32 --------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["prompt_ids", "completion_ids"])
@pytest.mark.parametrize("bad", [2**31, 2**40, -1])
def test_token_ids_outside_int32_are_rejected_on_insert(field, bad):
    b = make_batch(2, 4)
    ids = getattr(b, field).clone()
    mask = b.prompt_mask if field == "prompt_ids" else b.completion_mask
    r, c = mask.nonzero()[0].tolist()  # a real token, not padding
    ids[r, c] = bad
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0))
    with pytest.raises(ValueError, match=rf"ReplayBuffer.add: {field} holds token id {bad}; allowed: 0 <= id <= 2147483647"):
        buf.add(dataclasses.replace(b, **{field: ids}), 0)
    assert len(buf) == 0


def test_largest_int32_token_id_round_trips_and_padding_is_ignored():
    b = make_batch(2, 4)
    ids = b.completion_ids.clone()
    ids[0, 0] = 2**31 - 1
    pad = b.prompt_mask == 0
    prompt_ids = b.prompt_ids.masked_fill(pad, 2**40)  # padding values are never stored
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0))
    buf.add(dataclasses.replace(b, completion_ids=ids, prompt_ids=prompt_ids), 0)
    out = buf.gather(buf.storage.valid_slots())
    assert int(out.completion_ids.max()) == 2**31 - 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
@pytest.mark.parametrize("field", ["prompt_ids", "completion_ids"])
def test_token_ids_of_a_non_integer_dtype_are_refused_on_insert(field, dtype):
    b = make_batch(2, 4)
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0))
    with pytest.raises(ValueError, match=rf"ReplayBuffer.add: {field} has dtype {dtype}; allowed: an integer dtype"):
        buf.add(dataclasses.replace(b, **{field: getattr(b, field).to(dtype)}), 0)
    assert len(buf) == 0


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.int64])
def test_token_ids_of_any_integer_dtype_are_stored_as_they_are(dtype):
    b = make_batch(2, 4)
    small = dataclasses.replace(b, prompt_ids=b.prompt_ids % 200, completion_ids=b.completion_ids % 200)
    typed = dataclasses.replace(small, prompt_ids=small.prompt_ids.to(dtype), completion_ids=small.completion_ids.to(dtype))
    bufs = [ReplayBuffer(ReplayConfig(warmup_steps=0)) for _ in range(2)]
    bufs[0].add(small, 0)
    bufs[1].add(typed, 0)
    a, t = (buf.gather(buf.storage.valid_slots()) for buf in bufs)
    assert torch.equal(a.prompt_ids, t.prompt_ids) and torch.equal(a.completion_ids, t.completion_ids)


def test_a_prompt_mask_of_another_shape_is_refused_on_insert():
    b = make_batch(2, 4)
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0))
    with pytest.raises(ValueError, match="ReplayBuffer.add: prompt_mask has shape .* prompt_ids has .* they must match"):
        buf.add(dataclasses.replace(b, prompt_mask=b.prompt_mask[:, 1:]), 0)
    assert len(buf) == 0
