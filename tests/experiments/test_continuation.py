"""compare continues a finished shorter run instead of training a longer one from step 0 (`continuation.py`): the
continued run equals an uninterrupted one, waits for its source within one invocation, and leaves the source as
it was; a run that differs in anything but its length is not continued."""
import json

import pytest

from helpers import read_jsonl, train_metrics, without_times

from grpo_replay.experiments import continuation, jobs, stats
from grpo_replay.experiments.arms import Arm


def _sched(tiny):
    return {**tiny, "eval_every": 2, "checkpoint_every": 2, "steps": 4}


@pytest.mark.slow
def test_a_longer_run_continues_the_shorter_one_and_equals_an_uninterrupted_run(tiny_overrides, tmp_path):
    base = _sched(tiny_overrides)
    arms = [Arm("grpo", "GRPO", {"preset": "grpo"}), Arm("grpo_long", "GRPO, 6 steps", {"preset": "grpo", "steps": 6})]
    specs = jobs.plan(arms, [0], base, tmp_path / "out")
    short, long = specs
    assert short.lineage == long.lineage and short.run_dir != long.run_dir
    # both to do in one invocation, two jobs: the long run waits for the short one, then continues it
    res = jobs.execute(specs, jobs=2, progress=False)
    assert res["ran"] == 2 and not res["failed"]
    info = json.loads((long.run_dir / continuation.CONTINUED).read_text())
    assert info["from"] == str(short.run_dir) and info["steps"] == 4
    assert "resuming" in (long.run_dir / "train.log").read_text()
    direct = train_metrics({**base, "steps": 6}, tmp_path / "direct", preset="grpo", seed=0, **{"testbed.seed": 0})
    assert without_times(read_jsonl(long.run_dir / "metrics.jsonl")) == without_times(direct)
    assert read_jsonl(long.run_dir / "evals.jsonl") == read_jsonl(tmp_path / "direct" / "evals.jsonl")
    # the source is untouched: still its own 4 steps, its summary, no marker
    assert json.loads((short.run_dir / "summary.json").read_text())["steps"] == 4
    assert len(read_jsonl(short.run_dir / "metrics.jsonl")) == 4 and not (short.run_dir / continuation.CONTINUED).exists()
    # a report names both commits when the first steps were made at another one
    info["provenance"]["commit"] = "0ld0ld0"
    (long.run_dir / continuation.CONTINUED).write_text(json.dumps(info))
    assert stats.load_run("grpo_long", 0, long.run_dir).commit.startswith("0ld0ld0 then ")


def test_a_run_that_differs_in_more_than_its_length_or_evaluates_off_schedule_is_not_continued(tiny_overrides, tmp_path):
    base = _sched(tiny_overrides)
    (short,) = jobs.plan([Arm("grpo", "GRPO", {"preset": "grpo"})], [0], base, tmp_path / "out")
    assert jobs.execute([short], jobs=1, progress=False)["ran"] == 1
    key, eval_every = short.lineage, 2

    def source_for(arm_overrides, seed=0):
        (s,) = jobs.plan([Arm("x", "x", arm_overrides)], [seed], base, tmp_path / "out")
        return continuation.find_source(s.run_dir, s.seed, s.lineage, s.steps, eval_every)

    assert source_for({"preset": "grpo", "steps": 6}) == short.run_dir
    assert source_for({"preset": "grpo", "steps": 6, "drift_probe": 4}) is None  # another diagnostic: another run
    assert source_for({"preset": "grpo", "steps": 6, "eval_every": 3}) is None  # another evaluation schedule
    assert source_for({"preset": "grpo", "steps": 6}, seed=1) is None  # another seed
    assert source_for({"preset": "paper", "steps": 6}) is None
    assert source_for({"preset": "grpo", "steps": 4}) is None  # not longer
    # a source whose last step is not on the schedule would leave an evaluation an uninterrupted run lacks
    assert continuation.find_source(tmp_path / "out" / "runs" / "x" / "seed0-new", 0, key, 6, 3) is None
