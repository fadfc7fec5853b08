"""Shared pieces of the reliability tests: CLI argument lists for the tiny testbed and one reference run."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def cli_args(overrides: dict, out, **extra) -> list[str]:
    """`grpo-replay train` arguments (after the program name) for the tiny config plus `extra` keys."""
    argv = ["train", "--out", str(out), "--no-progress"]
    for k, v in {**overrides, **extra}.items():
        if k == "progress":
            continue
        argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return argv


@pytest.fixture(scope="session")
def train_args(tiny_overrides):
    return lambda out, **extra: cli_args(tiny_overrides, out, **extra)


@pytest.fixture(scope="session")
def reference_run(tiny_overrides, tmp_path_factory):
    """An uninterrupted run of the tiny config (seed 0) through the CLI, in this process; also warms the
    testbed cache so later runs (and subprocesses) load the warm start instead of training it."""
    from grpo_replay.cli import main

    out = tmp_path_factory.mktemp("reference") / "run"
    assert main(cli_args(tiny_overrides, out)) == 0
    return out


def cli_env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="session")
def run_cli():
    """Start `python -m grpo_replay.cli ARGS` as a real process (Popen, stdout+stderr to a log file), with SIGINT
    at its default as from a terminal (pytest-xdist workers ignore SIGINT; an ignored signal is inherited, and
    the trainer, by design, leaves an ignored SIGINT ignored)."""

    def start(args: list[str], log: Path) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "grpo_replay.cli", *args], stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=cli_env(),
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    return start
