"""The check of scripts/update_docs_figures.py: exact on a recorded CPU kind, properties on any other; timings ignored."""
from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("update_docs_figures", ROOT / "scripts" / "update_docs_figures.py")
figs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(figs)


def measured(**changes):
    rec = {"figures": {"heldout_acc_sampled_start_pct": 10.0, "heldout_acc_sampled_end_pct": 20.0,
                       "heldout_acc_greedy_start_pct": 12.0, "heldout_acc_greedy_end_pct": 22.0,
                       "warm_start_step": 250, "warm_start_pass_rate_pct": 10.5},
           "timings": {"main_job_seconds": 102.0, "warm_start_seconds": 27.0}}
    rec["figures"].update(changes)
    return rec


FACTS = {"warm_start_stop_reason": "in_window", "warm_start_window_pct": [10.0, 25.0], "replayed_rows": 900}


def test_a_recorded_kind_is_checked_exactly_and_timings_are_not():
    base = measured()
    slower = copy.deepcopy(base)
    slower["timings"]["main_job_seconds"] = 999.0
    assert figs.drift(base, slower) == []
    (msg,) = figs.drift(base, measured(heldout_acc_sampled_end_pct=20.1))
    assert "heldout_acc_sampled_end_pct" in msg and "20.0" in msg and "20.1" in msg
    assert figs.drift(base, measured(warm_start_step=275))


def test_properties_every_kind_shares_hold_for_a_sound_run():
    assert figs.invariants(measured(), FACTS) == []


@pytest.mark.parametrize("changes, facts, words", [
    ({"heldout_acc_sampled_end_pct": 10.0 + figs.MIN_RISE_PP - 0.1}, {}, "rose by"),  # training that does not learn
    ({"heldout_acc_greedy_end_pct": 11.9}, {}, "greedy accuracy fell"),
    ({}, {"replayed_rows": 0}, "replayed no rows"),  # replay turned off in the paper's preset
    ({}, {"warm_start_stop_reason": "overshoot"}, "'overshoot'"),
    ({"warm_start_pass_rate_pct": 26.0}, {}, "not inside its window [10.0, 25.0]"),
])
def test_a_broken_run_fails_the_properties(changes, facts, words):
    (msg,) = figs.invariants(measured(**changes), {**FACTS, **facts})
    assert words in msg


def test_readme_holds_the_paragraph_docs_figures_json_renders():
    text = (ROOT / "README.md").read_text()
    assert text.count(figs.BEGIN) == 1 and text.count(figs.END) == 1
    recorded = json.loads(figs.FIGURES.read_text())
    assert figs.render(recorded) in text
    assert recorded["command"] == figs.COMMAND and recorded["readme_kind"] in recorded["kinds"]
    for key, kind in recorded["kinds"].items():
        assert key == figs.kind_key(kind) and "uncommitted" not in kind["commit"] and "unknown" not in key
        assert figs.invariants(kind, {**FACTS, "warm_start_window_pct": [10.0, 25.0]}) == []


def test_the_kind_follows_the_kernels_torch_dispatches_to():
    """ATEN_CPU_CAPABILITY changes the floats as another CPU kind does, so it changes the kind too."""
    import subprocess
    import sys

    code = ("import importlib.util as u; s = u.spec_from_file_location('f', %r); m = u.module_from_spec(s); "
            "s.loader.exec_module(m); print(m.kind_key(m.this_kind()))" % str(ROOT / "scripts" / "update_docs_figures.py"))
    run = lambda env: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()  # noqa: E731
    import os

    default = run(dict(os.environ))
    lowest = run({**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert default == figs.kind_key(figs.this_kind()) and figs.cpu_model() in default
    assert lowest.endswith(" / DEFAULT, torch " + figs.this_kind()["torch"]) and lowest != default


def test_set_is_refused_without_check(capsys):
    with pytest.raises(SystemExit) as e:
        figs.main(["--set", "lr=1e-12"])
    assert e.value.code == 2 and "--set is for --check only" in capsys.readouterr().err


def test_run_checks_only_a_finished_main_job_of_this_code_from_an_empty_cache(tmp_path):
    """CI checks the run the README's main job made (`--check --run`), so the job runs once: a run of other code,
    another config, a cached warm start or an unfinished run is refused by name, not checked."""
    from grpo_replay.trainer.train_config import resolve

    run = tmp_path / "paper-seed0"
    run.mkdir()
    assert "holds no summary.json" in figs.finished_main_job(run)[0]
    (run / "config.yaml").write_text(resolve({"progress": False}).to_yaml())
    summary = {"provenance": {"commit": figs.git_commit(ROOT)}, "setup": {"warm_start": {"from_cache": False}}}
    (run / "summary.json").write_text(json.dumps(summary))
    assert figs.finished_main_job(run) == []
    summary = {"provenance": {"commit": "0000000"}, "setup": {"warm_start": {"from_cache": True}}}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "config.yaml").write_text(resolve({"steps": 3}).to_yaml())
    commit, cache, config = figs.finished_main_job(run)
    assert "made by commit 0000000" in commit and "came from a cache" in cache and "steps differ" in config
    assert figs.main(["--check", "--run", str(run)]) == 2
    with pytest.raises(SystemExit):
        figs.main(["--run", str(run)])  # recording always runs the job itself
