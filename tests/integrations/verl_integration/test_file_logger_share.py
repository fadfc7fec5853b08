"""The log scripts/gpu_smoke.sh's verl path checks: verl 0.9.1's own `file` logger (trainer.logger=[...,"file"],
its path from VERL_FILE_LOGGER_PATH) writing what the v1 trainer logs per step, read by
scripts/check_replay_share.py."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("verl.utils.tracking")

import gpu_commands as gc  # noqa: E402

from grpo_replay import metric_names as mn  # noqa: E402


def test_verl_file_logger_output_is_what_the_share_check_reads(tmp_path, monkeypatch):
    from verl.utils.tracking import Tracking

    path = tmp_path / "verl-metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    tracking = Tracking(project_name="grpo-replay", experiment_name="gpu-smoke", default_backend=["console", "file"])
    for step, replayed in ((1, 0), (2, 32)):  # 64 fresh rows a step; the second replays the paper ratio's third
        tracking.log({mn.FRESH_COUNT: 64.0, mn.REPLAY_COUNT: float(replayed),
                      mn.REPLAY_SHARE: replayed / (64 + replayed), "actor/pg_loss": np.float32(-0.01),
                      "training/global_step": step}, step=step)
    tracking.log({"val-core/math/acc/mean@1": 0.25}, step=2)
    tracking.finish()
    check = [sys.executable, str(gc.ROOT / "scripts/check_replay_share.py"), str(path), "--ratio", "0.5"]
    ok = subprocess.run(check, capture_output=True, text=True)
    assert ok.returncode == 0 and "0.000 0.333" in ok.stdout, (ok, path.read_text())
    # A run whose second step replayed nothing is judged from the same file: it fails.
    path.write_text(path.read_text().replace('"replay/count":32.0', '"replay/count":0.0')
                    .replace('"replay/share":0.3333333333333333', '"replay/share":0.0'))
    bad = subprocess.run(check, capture_output=True, text=True)
    assert bad.returncode == 1 and "no replayed row" in bad.stderr, (bad, path.read_text())
