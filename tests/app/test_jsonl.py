"""The one reader and writer of a run's JSONL logs (`grpo_replay.app.jsonl`), and the old metric names read as the
one vocabulary (`grpo_replay.metric_names`)."""
import json

from grpo_replay.app import jsonl
from grpo_replay.metric_names import LEGACY, REPLAY_ABS_ADV, REPLAY_COUNT, canonical


def _write(path, rows, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_a_torn_last_line_and_lines_that_are_not_rows_are_skipped(tmp_path):
    p = tmp_path / "metrics.jsonl"
    _write(p, [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.25}], tail='\n[1, 2]\n{"no_step": 1}\n{"step": 3, "rew')
    assert jsonl.read(p) == [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.25}]
    assert jsonl.read(tmp_path / "missing.jsonl") == []


def test_append_then_read_round_trips(tmp_path):
    p = tmp_path / "evals.jsonl"
    for s in range(3):
        jsonl.append(p, {"step": s, "acc": s / 4})
    assert jsonl.read(p) == [{"step": s, "acc": s / 4} for s in range(3)]


def test_truncate_keeps_the_rows_up_to_the_step_and_drops_a_torn_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    _write(p, [{"step": s} for s in range(1, 6)], tail='{"step": 6, "x"')
    jsonl.truncate(p, 3)
    assert p.read_text() == "".join(json.dumps({"step": s}) + "\n" for s in range(1, 4))
    jsonl.truncate(p, -1)
    assert p.read_text() == "" and not (tmp_path / "metrics.jsonl.tmp").exists()
    jsonl.truncate(tmp_path / "missing.jsonl", 3)  # nothing to trim: no file made
    assert not (tmp_path / "missing.jsonl").exists()


def test_old_backend_names_are_read_as_the_one_vocabulary(tmp_path):
    p = tmp_path / "metrics.jsonl"
    old_trl = {"step": 1, "replay/rows": 4.0, "replay/evicted_age_total": 2.0, "replay/buffer_size": 30.0}
    old_verl = {"step": 2, "replay/replay_rows": 3.0, "replay/fresh_rows": 5.0, "replay/abs_adv_replay": 0.7,
                "replay/age_versions/mean": 1.5}
    _write(p, [old_trl, old_verl])
    got = jsonl.read_metrics(p)
    assert got == [{"step": 1, "replay/count": 4.0, "buffer/evicted_age": 2.0, "buffer/size": 30.0},
                   {"step": 2, "replay/count": 3.0, "fresh/count": 5.0, "replay/abs_adv": 0.7,
                    "replay/age_versions_mean": 1.5}]
    assert jsonl.read(p) == [old_trl, old_verl]  # the plain reader leaves the keys as written


def test_canonical_keeps_a_new_name_over_its_old_one_and_every_old_name_maps_to_a_new_one():
    assert canonical({REPLAY_COUNT: 2, "replay/rows": 9, "reward": 1.0}) == {REPLAY_COUNT: 2, "reward": 1.0}
    assert canonical({"replay/abs_adv_replay": 0.5}) == {REPLAY_ABS_ADV: 0.5}
    assert not set(LEGACY) & set(LEGACY.values())  # renaming twice cannot change a name again
