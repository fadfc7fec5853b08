"""TRL's own GRPO tests, run twice: on stock `trl.GRPOTrainer` and through our drop-in (`ReplayGRPOTrainer`, replay on
with the paper preset from the first step). Every selected test that passes on stock must pass through ours.

TRL's test file is not part of this repository (its code stays upstream): `bash scripts/fetch_trl_tests.sh
TRL_GIT_DIR` exports it into .cache/trl_tests, or TRL_TESTS_DIR names a folder that holds `test_grpo_trainer.py` and
`testing_utils.py`; without one the test skips. The hub model and datasets the tests name are built locally by
trl_own/offline_plugin.py, so nothing downloads.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from helpers import fresh_process_env

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = Path(__file__).resolve().parent / "trl_own"

# TRL tests that run on CPU in seconds with the tiny model: none needs vLLM, PEFT, Liger, a GPU or a reward model
# from the hub (test_init_minimal does), or builds its config inside TRL (args=None: bf16 on a CPU fails).
# Each trains ~18 steps (~15 s on a busy CPU), twice: TRL_OWN_SELECT (a comma-separated list) runs others.
SELECTED = [
    "TestGRPOTrainer::test_train_dataset_format",
    "TestGRPOTrainer::test_train_reward_func_standard",
    "TestGRPOTrainer::test_train_multiple_reward_funcs_with_weights",
    "TestGRPOTrainer::test_train_reward_func_additional_column",
    "TestGRPOTrainer::test_train_beta_non_zero",
    "TestGRPOTrainer::test_train_multiple_iterations",
]


def trl_tests_dir() -> Path | None:
    d = Path(os.environ.get("TRL_TESTS_DIR") or ROOT / ".cache/trl_tests")
    return d if (d / "test_grpo_trainer.py").is_file() and (d / "testing_utils.py").is_file() else None


def run_trl_tests(pkg_parent: Path, assets: Path, swap: bool) -> dict[str, str]:
    """Run the selection in a fresh interpreter; returns {test id: "passed" | "failed: ..." | "skipped"}."""
    report = pkg_parent / f"report_{int(swap)}.xml"
    env = {**fresh_process_env(), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "TRL_OWN_SWAP": "1" if swap else "0", "TRL_OWN_ASSETS": str(assets),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(PLUGIN_DIR), str(pkg_parent)])}
    selected = os.environ.get("TRL_OWN_SELECT", "").split(",") if os.environ.get("TRL_OWN_SELECT") else SELECTED
    ids = [f"trl_tests/test_grpo_trainer.py::{t}" for t in selected]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "offline_plugin", "-p", "no:cacheprovider", "-c", os.devnull,
           "--rootdir", str(pkg_parent), f"--junitxml={report}", *ids]
    proc = subprocess.run(cmd, cwd=pkg_parent, env=env, capture_output=True, text=True, timeout=1200)
    assert report.exists(), f"pytest wrote no report (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    out = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        status = "skipped" if case.find("skipped") is not None else "passed"
        if bad is not None:
            status = "failed: " + (bad.get("message") or "")[:400]
        out[f"{case.get('classname')}::{case.get('name')}"] = status
    return out


@pytest.mark.slow
def test_trl_own_grpo_tests_pass_through_replay_trainer(tmp_path):
    src = trl_tests_dir()
    if src is None:
        pytest.skip("TRL's test file is absent: run `bash scripts/fetch_trl_tests.sh TRL_GIT_DIR` or set TRL_TESTS_DIR")
    pkg = tmp_path / "trl_tests"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for f in ("test_grpo_trainer.py", "testing_utils.py"):
        shutil.copy(src / f, pkg / f)
    stock = run_trl_tests(tmp_path, tmp_path / "assets", swap=False)
    ours = run_trl_tests(tmp_path, tmp_path / "assets", swap=True)
    passed_stock = sorted(t for t, s in stock.items() if s == "passed")
    print(f"TRL tests: {len(stock)} run, {len(passed_stock)} passed on stock, "
          f"{sum(s == 'passed' for s in ours.values())} passed through ReplayGRPOTrainer")
    assert len(passed_stock) >= len(stock) // 2, f"most TRL tests failed on stock (setup broken?): {stock}"
    regressions = {t: ours.get(t, "not run") for t in passed_stock if ours.get(t) != "passed"}
    assert not regressions, f"TRL tests that pass on stock but not through ReplayGRPOTrainer: {regressions}"
    replayed = json.loads((tmp_path / "assets/replay_rows.json").read_text())
    print("replayed rows per TRL test:", replayed)
    assert replayed and all(n > 0 for n in replayed.values()), f"replay never ran in some TRL test: {replayed}"
