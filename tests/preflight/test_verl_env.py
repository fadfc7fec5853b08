"""The verl GPU environment (scripts/setup_verl_gpu.sh) gets what `grpo-replay preflight` imports: the app extra,
with transformers held where verl put it."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_setup_verl_gpu_installs_the_app_extra_at_verls_transformers(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls.log"
    py = venv / "bin/python"  # a stand-in: records each call; reports verl's transformers when asked
    py.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\ncase \"$1\" in -c) echo 5.10.4;; esac\n")
    py.chmod(0o755)
    env = {**os.environ, "VERL_GPU_VENV": str(venv), "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", "scripts/setup_verl_gpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    installs = [line for line in log.read_text().splitlines() if line.startswith("-m pip install")]
    verl = next(i for i, line in enumerate(installs) if "verl[vllm,fsdp]==0.9.1" in line)
    assert installs[verl + 1:] == ["-m pip install -e .[app] transformers==5.10.4"], installs
