"""The drift check of scripts/update_docs_figures.py: it flags a changed figure and ignores timings."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("update_docs_figures", ROOT / "scripts" / "update_docs_figures.py")
figs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(figs)


def record(**changes):
    rec = {"command": figs.COMMAND, "commit": "abc1234", "machine": "2 CPU cores",
           "figures": {"heldout_acc_sampled_start_pct": 10.0, "heldout_acc_sampled_end_pct": 20.0,
                       "heldout_acc_greedy_start_pct": 12.0, "heldout_acc_greedy_end_pct": 22.0,
                       "warm_start_step": 250, "warm_start_pass_rate_pct": 10.5},
           "timings": {"main_job_seconds": 102.0, "warm_start_seconds": 27.0}}
    rec["figures"].update(changes)
    return rec


def test_drift_flags_changed_figures_not_timings():
    base = record()
    slower = json.loads(json.dumps(base))
    slower["timings"]["main_job_seconds"] = 999.0
    assert figs.drift(base, slower) == []
    assert figs.drift(base, record(heldout_acc_sampled_end_pct=20.0 + figs.TOLERANCE_PP)) == []
    (msg,) = figs.drift(base, record(heldout_acc_sampled_end_pct=21.0))
    assert "heldout_acc_sampled_end_pct" in msg and "20.0" in msg and "21.0" in msg
    assert figs.drift(base, record(warm_start_step=251))


def test_readme_holds_the_paragraph_docs_figures_json_renders():
    text = (ROOT / "README.md").read_text()
    assert text.count(figs.BEGIN) == 1 and text.count(figs.END) == 1
    recorded = json.loads(figs.FIGURES.read_text())
    assert figs.render(recorded) in text
    assert recorded["command"] == figs.COMMAND and recorded["commit"] != "unknown"
