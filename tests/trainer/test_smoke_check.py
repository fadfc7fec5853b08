"""scripts/smoke_check.py (the checker scripts/gpu_smoke.sh runs on CUDA in bf16), run on CPU in float32."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_replay import ReplayConfig
from helpers import fresh_process_env, make_batch

ROOT = Path(__file__).resolve().parents[2]


def _checker():
    spec = importlib.util.spec_from_file_location("smoke_check", ROOT / "scripts" / "smoke_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_checker_finds_each_violation():
    check = _checker().check_composed
    cfg = ReplayConfig(warmup_steps=0, tau_max=3)
    fresh = make_batch(2, 4, step=5)
    replay = make_batch(1, 4, step=4)
    replay.is_replay[:] = True
    ok = type(fresh).concat([fresh, replay])
    assert check(ok, 8, 5, 100, cfg) == []
    age0 = type(fresh).concat([fresh, make_batch(1, 4, step=5)])
    age0.is_replay[8:] = True
    assert any("age 0" in p for p in check(age0, 8, 5, 100, cfg))
    assert any("> tau_max=3" in p for p in check(ok, 8, 9, 100, cfg))
    ok.completion_mask[9] = 0
    assert any("empty completion mask" in p for p in check(ok, 8, 5, 100, cfg))
    assert any("expected 4" in p for p in check(fresh, 8, 5, 100, cfg))  # replay share not as configured
    pool = ReplayConfig.uniform_pool(warmup_steps=0)
    assert any("at most" in p for p in check(ok, 8, 5, 100, pool))  # a pool must keep the fresh total


def test_the_checker_finds_replay_rows_lost_to_the_split():
    """TRL's split into micro-batches: 8 fresh + 4 replay rows into 8 forwards keeps 0 replay rows; the checker
    names the step whose planned rows did not all train, and a split that keeps them passes."""
    check = _checker().check_trained
    assert check({2: (8, 4, 4)}, {2: 4}, unit=4) == []
    lost = check({2: (8, 4, 4)}, {2: 0}, unit=8)
    assert lost == ["step 2: 0 of 4 planned replay rows trained after the split into 8 micro-batches: the share is "
                    "not the configured one"]
    assert any("reached the loss" in p for p in check({2: (8, 4, 4)}, {2: 0}, unit=4))  # rows lost elsewhere
    assert check({1: (8, 2, 4)}, {1: 2}, unit=2) == [
        "no step drew its full replay count, so the share after the split was never checked"]


@pytest.mark.slow
def test_smoke_check_runs_both_trainers_on_cpu(tmp_path, tiny_overrides):
    out = tmp_path / "smoke"
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "smoke_check.py"), "--device", "cpu", "--dtype", "float32",
         "--steps", "3", "--out", str(out), "--cache-dir", tiny_overrides["testbed.cache_dir"]],
        capture_output=True, text=True, timeout=600,
        env={**fresh_process_env(), "PYTHONPATH": str(ROOT / "src")},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "smoke_check: all invariants hold" in res.stdout
    for name in ("builtin", "trl"):
        line = next(x for x in res.stdout.splitlines() if x.startswith(f"smoke_check {name}:"))
        assert " 0 replay rows" not in line, line
