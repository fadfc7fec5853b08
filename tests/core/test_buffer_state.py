"""ReplayBuffer.save/load: names with dots, and every field of the saved files validated on load."""
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_replay import BufferStateError, ReplayBuffer, ReplayConfig
from grpo_replay.buffer_state import checksum
from helpers import make_batch

CFG = ReplayConfig(warmup_steps=0, tau_max=2)


def _buffer(with_ref=False, steps=6):
    buf = ReplayBuffer(CFG, seed=3)
    for t in range(steps):
        buf.sample(3, t)
        buf.add(make_batch(2, 3, step=t, seed=t, with_ref=with_ref), t)
    return buf


def _read(path):
    with np.load(str(path) + ".npz") as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads(Path(str(path) + ".json").read_text())


def _write(path, arrays, state, forge=True):
    """Write files; with forge, a valid checksum for the new contents (a consistent forgery)."""
    if forge and "checksum" in state:
        state["checksum"] = checksum(state, arrays)
    np.savez(str(path) + ".npz", **arrays)
    Path(str(path) + ".json").write_text(json.dumps(state))


def _same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def test_names_with_dots_keep_their_whole_name(tmp_path):
    buf = _buffer(steps=2)
    buf.save(tmp_path / "buffer.step1")
    buf.add(make_batch(1, 3, step=2, seed=9), 2)
    buf.save(tmp_path / "buffer.step2")
    assert sorted(os.listdir(tmp_path)) == ["buffer.step1.json", "buffer.step1.npz", "buffer.step2.json", "buffer.step2.npz"]
    assert len(ReplayBuffer.load(tmp_path / "buffer.step1")) == 12
    assert len(ReplayBuffer.load(tmp_path / "buffer.step2")) == 15


def _nan_advantage(a, s):
    a["col.advantage"] = a["col.advantage"].copy()
    a["col.advantage"][np.flatnonzero(a["valid"])[0]] = np.nan


def _negative_weight(a, s):
    a["col.weight"] = a["col.weight"].copy()
    a["col.weight"][np.flatnonzero(a["valid"])[0]] = -1.0


def _future_birth(a, s):
    a["col.birth_step"] = a["col.birth_step"].copy()
    a["col.birth_step"][np.flatnonzero(a["valid"])[0]] = s["step"] + 1


def _comp_len_mismatch(a, s):
    a["comp_len"] = a["comp_len"].copy()
    a["comp_len"][0] += 1


def _comp_len_not_at_a_counted_token(a, s):
    a["mask"] = a["mask"].copy()
    a["mask"][a["comp_len"][0] - 1] = False  # row 0 now ends before its stated length


def _duplicate_free(a, s):
    a["free"] = a["free"].copy()
    a["free"][1] = a["free"][0]


def _wrong_dtype(a, s):
    a["logps"] = a["logps"].astype(np.float64)


def _wrong_shape(a, s):
    a["col.reward"] = a["col.reward"][:-1]


def _missing_array(a, s):
    del a["mask"]


def _missing_json(a, s):
    del s["rng"]


def _bad_rng(a, s):
    s["rng"]["bit_generator"] = "MT19937"


def _bool_for_int(a, s):
    s["next_group"] = True


@pytest.mark.parametrize(
    "mutate, file, field",
    [
        (_nan_advantage, "npz", "col.advantage"),
        (_negative_weight, "npz", "col.weight"),
        (_future_birth, "npz", "col.birth_step"),
        (_comp_len_mismatch, "npz", "comp_len"),
        (_comp_len_not_at_a_counted_token, "npz", "comp_len"),
        (_duplicate_free, "npz", "free"),
        (_wrong_dtype, "npz", "logps"),
        (_wrong_shape, "npz", "col.reward"),
        (_missing_array, "npz", "mask"),
        (_missing_json, "json", "rng"),
        (_bad_rng, "json", "rng"),
        (_bool_for_int, "json", "next_group"),
    ],
)
def test_forged_fields_are_refused_naming_file_and_field(tmp_path, mutate, file, field):
    """Each edit comes with a recomputed checksum, so it is the field validation that must catch it."""
    _buffer().save(tmp_path / "b")
    arrays, state = _read(tmp_path / "b")
    mutate(arrays, state)
    _write(tmp_path / "b", arrays, state)
    with pytest.raises(BufferStateError, match=rf"b\.{file}: field '{field}'"):
        ReplayBuffer.load(tmp_path / "b")


def test_edited_file_fails_the_checksum(tmp_path):
    _buffer().save(tmp_path / "b")
    arrays, state = _read(tmp_path / "b")
    arrays["comp_ids"] = arrays["comp_ids"] + 1  # a valid buffer, just not the saved one
    _write(tmp_path / "b", arrays, state, forge=False)
    with pytest.raises(BufferStateError, match=r"b\.json: field 'checksum' does not match"):
        ReplayBuffer.load(tmp_path / "b")


def test_corrupt_files_raise_the_one_error(tmp_path):
    buf = _buffer()
    buf.save(tmp_path / "b")
    npz, js = Path(str(tmp_path / "b") + ".npz"), Path(str(tmp_path / "b") + ".json")
    good_npz, good_js = npz.read_bytes(), js.read_bytes()
    npz.write_bytes(good_npz[: len(good_npz) // 2])
    with pytest.raises(BufferStateError, match=r"b\.npz"):
        ReplayBuffer.load(tmp_path / "b")
    npz.write_bytes(b"not a zip file")
    with pytest.raises(BufferStateError, match=r"b\.npz: not a valid replay buffer arrays file"):
        ReplayBuffer.load(tmp_path / "b")
    npz.write_bytes(good_npz)
    js.write_bytes(good_js[:-5])
    with pytest.raises(BufferStateError, match=r"b\.json: not a valid replay buffer state file"):
        ReplayBuffer.load(tmp_path / "b")
    js.write_bytes(b"[1, 2]")
    with pytest.raises(BufferStateError, match=r"b\.json: must hold a JSON object"):
        ReplayBuffer.load(tmp_path / "b")
    js.unlink()
    with pytest.raises(BufferStateError, match=r"b\.json: replay buffer state file does not exist"):
        ReplayBuffer.load(tmp_path / "b")
    # a state dict handed to load_state_dict is validated the same way, and nothing changes on failure
    state = buf.state_dict()
    state["storage"]["col.advantage"][np.flatnonzero(state["storage"]["valid"])[0]] = np.inf
    fresh = ReplayBuffer(CFG)
    with pytest.raises(BufferStateError, match="col.advantage"):
        fresh.load_state_dict(state)
    assert len(fresh) == 0


def _as_version_4(state):
    """What version 5 added taken out: the arenas' allocated widths."""
    del state["storage_scalars"]["widths"]


def _as_version_3(arrays, state):
    """What version 4 added taken out: the replay counts, two totals and four config fields."""
    _as_version_4(state)
    del arrays["col.uses"]
    for k in ("evicted_uses", "evicted_drift"):
        assert state["totals"].pop(k) == 0
    for k in ("max_drift", "fill_filtered", "max_uses", "age_decay"):
        del state["config"][k]


def test_version_3_files_load_with_zero_replay_counts(tmp_path):
    buf = _buffer(with_ref=False)
    buf.save(tmp_path / "b")
    arrays, state = _read(tmp_path / "b")
    _as_version_3(arrays, state)
    state["version"] = 3
    _write(tmp_path / "b", arrays, state, forge=True)
    old = ReplayBuffer.load(tmp_path / "b")
    assert old.config == buf.config and (old.storage.col("uses")[old.storage.valid] == 0).all()
    a, b = buf.sample(4, 6), old.sample(4, 6)
    assert a.completion_ids.tolist() == b.completion_ids.tolist()


def test_version_1_files_still_load(tmp_path):
    """Files written before the checksum and "step" fields existed load and draw like the saved buffer."""
    buf = _buffer(with_ref=True)
    buf.save(tmp_path / "b")
    arrays, state = _read(tmp_path / "b")
    del state["checksum"], state["step"]
    state["version"] = 1
    _as_version_3(arrays, state)
    state["totals"] = [state["totals"][k] for k in ("added", "evicted_age", "evicted_capacity")]
    _write(tmp_path / "b", arrays, state, forge=False)
    old = ReplayBuffer.load(tmp_path / "b")
    assert old.last_step == 5  # the newest birth step
    for t in (6, 7):  # (all rows are older than tau_max = 2 at step 8)
        a, b = buf.sample(4, t), old.sample(4, t)
        assert len(a) == 4 and a.completion_ids.tolist() == b.completion_ids.tolist() and a.ref_logps.tolist() == b.ref_logps.tolist()


# --- every field mutated (hypothesis) -------------------------------------------------------------------
_SAVED = {}


def _saved(with_ref):
    """One saved buffer per flavour, kept in memory (hypothesis examples must not share a tmp_path)."""
    if with_ref not in _SAVED:
        buf = _buffer(with_ref=with_ref)
        with tempfile.TemporaryDirectory() as d:
            buf.save(Path(d) / "b")
            _SAVED[with_ref] = (buf.state_dict(), *_read(Path(d) / "b"))
    return _SAVED[with_ref]


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=6,
)
_DTYPES = [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64]


def _json_paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _json_paths(v, prefix + (i,))


@st.composite
def _mutation(draw):
    with_ref = draw(st.booleans())
    _, arrays, state = _saved(with_ref)
    arrays = {k: v.copy() for k, v in arrays.items()}
    state = json.loads(json.dumps(state))
    if draw(st.booleans()):  # an array: dtype, shape, one value, or removal
        k = draw(st.sampled_from(sorted(arrays)))
        how = draw(st.sampled_from(["dtype", "shape", "value", "remove", "2d"]))
        a = arrays[k]
        if how == "remove":
            del arrays[k]
        elif how == "dtype":
            arrays[k] = a.astype(draw(st.sampled_from(_DTYPES)))
        elif how == "shape":
            arrays[k] = a[:-1] if draw(st.booleans()) and len(a) else np.concatenate([a, a[-1:] if len(a) else np.zeros(1, a.dtype)])
        elif how == "2d":
            arrays[k] = a.reshape(1, -1)
        elif len(a):
            i = draw(st.integers(0, len(a) - 1))
            v = draw(st.sampled_from([np.nan, np.inf, -1, 0, 1, 2**40, -(2**40), 7]))
            with np.errstate(all="ignore"):
                a[i] = np.array(v).astype(a.dtype) if not (a.dtype.kind in "biu" and isinstance(v, float)) else 0
    else:  # a JSON field at any depth: removal or a new value of any JSON type
        path = draw(st.sampled_from([p for p in _json_paths(state) if p]))
        parent = state
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(_json_values)
    return with_ref, arrays, state, draw(st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutation())
def test_mutated_files_load_identically_or_raise_the_one_error(m):
    """Tampered (checksum left as saved): load restores an identical buffer or raises BufferStateError.
    Forged (checksum recomputed): BufferStateError, or a buffer whose every invariant holds: it saves and
    loads back identically, draws and takes new rows. Never another exception."""
    with_ref, arrays, state, forge = m
    original = _saved(with_ref)[0]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "b"
        _write(path, arrays, state, forge=forge)
        try:
            buf = ReplayBuffer.load(path)
        except BufferStateError:
            return
        if not forge:
            assert _same(buf.state_dict(), original)
            return
        buf.save(Path(d) / "again")
        assert _same(ReplayBuffer.load(Path(d) / "again").state_dict(), buf.state_dict())
        step = buf.last_step if buf.last_step is not None else 0
        out = buf.sample(4, step + 1)
        assert len(out) == min(4, len(buf)) and bool((out.completion_mask.sum(1) >= 0).all())
        buf.add(make_batch(1, 3, step=step + 1, seed=1, with_ref=buf.storage.has_ref or (len(buf) == 0 and with_ref)), step + 1)


def test_replay_counts_are_saved_restored_and_validated(tmp_path):
    cfg = CFG.replace(max_uses=3, tau_max=None)
    buf = ReplayBuffer(cfg, seed=3)
    buf.add(make_batch(2, 3, step=0, seed=0), 0)
    for t in range(1, 3):
        buf.sample(4, t)
    uses = buf.storage.col("uses")[buf.storage.valid].copy()
    assert uses.sum() == 8 and uses.max() <= 2
    buf.save(tmp_path / "b")
    back = ReplayBuffer.load(tmp_path / "b")
    assert np.array_equal(back.storage.col("uses")[back.storage.valid], uses)
    a, b = buf.sample(4, 3), back.sample(4, 3)  # same draws, same evictions at the limit
    assert a.buffer_seq.tolist() == b.buffer_seq.tolist() and len(buf) == len(back)
    assert back.total_evicted_uses == buf.total_evicted_uses > 0
    arrays, state = _read(tmp_path / "b")
    for bad_uses, why in ((-1, "col.uses"), (3, "col.uses")):
        forged = dict(arrays)
        forged["col.uses"] = arrays["col.uses"].copy()
        forged["col.uses"][np.flatnonzero(arrays["valid"])[0]] = bad_uses
        _write(tmp_path / "f", forged, dict(state))
        with pytest.raises(BufferStateError, match=rf"field '{why}' must be replay counts >= 0 and < max_uses=3"):
            ReplayBuffer.load(tmp_path / "f")


def _wide_then_narrow(seed=3):
    """A buffer whose widest rows (prompt 9, completion 12 positions, padded wider still) were evicted by age:
    the arenas stay as wide as they grew, wider than any row still stored."""
    buf = ReplayBuffer(CFG, seed=seed)
    buf.add(make_batch(2, 3, step=0, seed=1, max_prompt=9, max_completion=12), 0)
    for t in range(1, 6):
        buf.sample(3, t)
        buf.add(make_batch(2, 3, step=t, seed=t, max_prompt=3, max_completion=4), t)
    return buf


def test_a_loaded_buffer_holds_the_same_bytes_and_goes_on_like_the_saved_one(tmp_path):
    buf = _wide_then_narrow()
    assert int(buf.storage.col("comp_len")[buf.storage.valid].max()) <= 4 < buf.storage.width
    buf.save(tmp_path / "b")
    loaded = ReplayBuffer.load(tmp_path / "b")
    assert loaded.stats(6) == buf.stats(6)  # buffer/bytes included
    for t in range(6, 9):
        a, b = buf.sample(3, t), loaded.sample(3, t)
        assert a.completion_ids.tolist() == b.completion_ids.tolist()
        for x in (buf, loaded):
            x.add(make_batch(2, 3, step=t, seed=10 + t, max_prompt=4, max_completion=6), t)
        assert loaded.stats(t + 1) == buf.stats(t + 1)


def test_version_4_files_size_the_arenas_to_the_widest_stored_row(tmp_path):
    buf = _wide_then_narrow()
    buf.save(tmp_path / "b")
    arrays, state = _read(tmp_path / "b")
    _as_version_4(state)
    state["version"] = 4
    _write(tmp_path / "b", arrays, state, forge=True)
    old = ReplayBuffer.load(tmp_path / "b")
    widest = int(buf.storage.col("comp_len")[buf.storage.valid].max())
    assert old.storage.width == widest < buf.storage.width
    a, b = buf.sample(4, 6), old.sample(4, 6)
    assert a.completion_ids.tolist() == b.completion_ids.tolist()


@pytest.mark.parametrize("widths, message", [
    ({"prompt_ids": 9, "comp_ids": 1, "logps": 1, "mask": 2, "ref": 0}, "'storage_scalars.widths.comp_ids' is 1, narrower"),
    ({"prompt_ids": 9, "comp_ids": 12, "logps": 11, "mask": 2, "ref": 0}, "must give comp_ids and logps the same width"),
    ({"prompt_ids": 9, "comp_ids": 12, "logps": 12, "mask": 2}, "must map prompt_ids, comp_ids, logps, mask, ref"),
    ({"prompt_ids": -1, "comp_ids": 12, "logps": 12, "mask": 2, "ref": 0}, "must map prompt_ids"),
])
def test_forged_widths_are_refused(tmp_path, widths, message):
    _wide_then_narrow().save(tmp_path / "b")
    arrays, state = _read(tmp_path / "b")
    state["storage_scalars"]["widths"] = widths
    _write(tmp_path / "b", arrays, state, forge=True)
    with pytest.raises(BufferStateError, match=message):
        ReplayBuffer.load(tmp_path / "b")
