"""`accelerate launch` of a test's worker script on 2 CPU processes (gloo), for the multi-process TRL tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def launch_two(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """Run `script --worker ARGS...` on 2 processes. A run that outlives `timeout` (processes waiting in a collective
    the other never joins) fails the test and is stopped, its workers included."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--multi_gpu", "--main_process_port", str(port),
           script, "--worker", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM: torchrun then stops its workers, which run in sessions of their own (a SIGKILL would orphan them).
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = "", ""
        pytest.fail(f"the 2-process run hung (stopped after {timeout:.0f} s): {err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
