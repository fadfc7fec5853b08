"""Hypothesis fuzzing: config parsing fails only with ConfigError, data loading only with DataError(file:line)."""
import argparse
import json
import string
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_replay.errors import ConfigError
from grpo_replay.app.data import DataError, load_problems
from grpo_replay.cli import train as command
from grpo_replay.trainer.train_config import FIELDS, TrainConfig, resolve

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
keys = st.one_of(st.sampled_from(sorted(FIELDS)), st.text(string.ascii_lowercase + "._", min_size=1, max_size=20))


@FUZZ
@given(st.dictionaries(keys, values, max_size=4))
def test_resolve_random_overrides(overrides):
    try:
        cfg = resolve(overrides)
    except ConfigError as e:
        assert str(e)
    else:
        assert isinstance(cfg, TrainConfig)


def _args(sets, config=None):
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    argv = [f"--set={s}" for s in sets] + ([f"--config={config}"] if config else [])
    return p.parse_args(argv)


@FUZZ
@given(st.lists(st.tuples(keys, st.text(max_size=30)), max_size=4))
def test_command_line_set_values(pairs):
    """`--set KEY=TEXT` for random text: a validated config or a ConfigError, never a traceback."""
    try:
        cfg = command.config_from_args(_args([f"{k}={v}" for k, v in pairs]))
    except ConfigError as e:
        assert str(e)
    else:
        assert isinstance(cfg, TrainConfig) and cfg.run_dir


@pytest.mark.parametrize("text", ["2001-13-45", "[" * 600, "{a: 1", "!!python/object/apply:os.system [ls]", "&a [*a]"])
def test_command_line_set_hostile_values(text):
    for key in ("seed", "out_dir", "testbed.difficulty_weights"):
        try:
            command.config_from_args(_args([f"{key}={text}"]))
        except ConfigError:
            pass


@FUZZ
@given(st.text(max_size=200))
def test_yaml_config_file(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        command.config_from_args(_args([], config=str(path)))
    except ConfigError as e:
        assert str(e)


@pytest.mark.parametrize("text", ["seed: 2001-13-45\n", "seed: " + "[" * 600 + "\n", "out_dir: '{nope}'\n", "a: &a [*a]\n"])
def test_yaml_config_file_hostile(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        command.config_from_args(_args([], config=str(path)))


# --- data --------------------------------------------------------------------------------------------------
json_rows = st.dictionaries(st.sampled_from(["problem", "answer", "id", "source", "other"]),
                            st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8), st.lists(st.integers(), max_size=2)),
                            max_size=5).map(lambda d: json.dumps(d).encode())
lines = st.one_of(json_rows, st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
                  st.text(max_size=30).map(lambda t: t.replace("\n", "").encode("utf-8", "surrogatepass")))


def _nonblank(raw: bytes, first: bool = False) -> bool:
    if first:  # the loader drops a UTF-8 byte-order mark at the start of the file
        raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        return bool(raw.decode("utf-8").strip())
    except UnicodeDecodeError:
        return True


@FUZZ
@given(st.lists(lines, max_size=12))
def test_jsonl_loading(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_bytes(b"\n".join(rows) + b"\n")
    try:
        probs = load_problems(path)
    except DataError as e:
        assert e.where == str(path) and 1 <= e.line <= len(rows)
        assert str(e).startswith(f"{path}:{e.line}: ")
    else:
        assert all(p.problem.strip() and p.answer for p in probs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skip policy warns with the count; checked in test_bad_input
        skipped = load_problems(path, on_error="skip")
    assert len(skipped) + len(skipped.skipped) == sum(_nonblank(r, i == 0) for i, r in enumerate(rows))
    assert all(e.where == str(path) for e in skipped.skipped)


def test_deeply_nested_json_line_is_a_data_error(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"problem": "1+1", "answer": "2"}\n' + "[" * 100_000 + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: "):
        load_problems(path)
