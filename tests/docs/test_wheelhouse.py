"""scripts/build_wheelhouse.py builds a wheelhouse that installs offline over a preinstalled stack and runs there.

The stack stands in for a GPU container's: a fresh venv holding only torch (this machine's CPU build, the version
the suite runs), transformers 5.17 (what the GPU install resolves to: docs/trl.md) and accelerate 1.13. The
wheelhouse is built for this Python (3.11; the documented build targets 3.12, binary wheels for it only), installed
with `--no-index --find-links` and no pip configuration (so nothing but the wheelhouse is seen), must keep the
installed torch, and then runs a CPU twin there: scripts/smoke_check.py's TRL path (ReplayGRPOTrainer on the testbed,
replay's invariants checked on every composed batch) and `grpo-replay train` for 2 steps. Needs PyPI (the build
downloads); skipped, saying so, when it cannot be reached.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from helpers import fresh_process_env

ROOT = Path(__file__).resolve().parents[2]
STACK_HF = ("transformers==5.17.0", "accelerate==1.13.0")
NETWORK_ERRORS = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                  "Network is unreachable", "Connection refused", "Read timed out")


def _torch_pin() -> str:
    import torch

    return f"torch=={torch.__version__}"


def _clean_env(**extra: str) -> dict:
    """This environment without pip's settings and the checkout on the path (and without launch variables)."""
    return {**fresh_process_env(drop=("PYTHONPATH",), drop_prefixes=("PIP_",)), **extra}


def _run(argv, timeout=1200, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)


def _registry_reachable(tmp: Path) -> tuple[bool, str]:
    probe = _run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--only-binary=:all:", "-d", tmp,
                  "trl==1.16.0"], timeout=180)
    return probe.returncode == 0, (probe.stderr or probe.stdout)[-300:]


def test_build_refuses_bad_arguments_before_any_download(tmp_path):
    script = ROOT / "scripts/build_wheelhouse.py"
    bad = _run([sys.executable, script, tmp_path / "w", "--stack", "transformers==5.17.0"], timeout=60)
    assert bad.returncode == 2 and "--stack must pin torch exactly" in bad.stderr
    bad = _run([sys.executable, script, tmp_path / "w", "--stack", "torch==2.11.0 bad!!"], timeout=60)
    assert bad.returncode == 2 and "it takes pins such as torch==2.11.0" in bad.stderr
    bad = _run([sys.executable, script, tmp_path / "w", "--python-version", "3"], timeout=60)
    assert bad.returncode == 2 and "--python-version takes major.minor" in bad.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    bad = _run([sys.executable, script, tmp_path / "full"], timeout=60)
    assert bad.returncode == 2 and "is not empty" in bad.stderr


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a pip install of torch, a build, an install, two CPU runs: minutes on 2 cores
def test_wheelhouse_installs_offline_over_the_stack_and_trains(tmp_path):
    ok, why = _registry_reachable(tmp_path / "probe")
    if not ok:
        pytest.skip(f"the package registry cannot be reached from here (pip download trl failed: {why.strip()})")
    house = tmp_path / "wheelhouse"
    py_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    build = _run([sys.executable, ROOT / "scripts/build_wheelhouse.py", house, "--python-version", py_version,
                  "--stack", " ".join([_torch_pin(), *STACK_HF])])
    said = build.stdout + build.stderr
    if build.returncode != 0 and any(m in said for m in NETWORK_ERRORS):
        pytest.skip(f"the package registry stopped answering during the build: {said.strip()[-300:]}")
    assert build.returncode == 0, said[-6000:]
    manifest = json.loads((house / "manifest.json").read_text())
    names = {f.split("-")[0].lower() for f in manifest["files"]}
    assert {"grpo_replay", "trl", "datasets", "math_verify"} <= names, names
    assert not names & {"torch", "transformers", "accelerate", "nvidia_cudnn_cu13", "triton"}, names  # the stack's

    env_dir = tmp_path / "stack"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    stack = _run([py, "-m", "pip", "install", "-q", _torch_pin(), *STACK_HF], env=_clean_env(
        **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}))  # the machine's own sources for the stack
    assert stack.returncode == 0, stack.stderr[-3000:]
    where_torch = "import torch; print(torch.__version__, torch.__file__)"
    before = _run([py, "-c", where_torch], cwd=tmp_path).stdout
    assert _run([py, "-c", "import trl"], cwd=tmp_path).returncode != 0  # only the stack is there

    offline = _clean_env(PIP_CONFIG_FILE=os.devnull, HF_HUB_OFFLINE="1")
    inst = _run([py, "-m", "pip", "install", "--no-index", "--find-links", house, "-r", house / "requirements.txt"],
                env=offline)
    assert inst.returncode == 0, inst.stdout[-3000:] + inst.stderr[-3000:]
    assert _run([py, "-c", where_torch], cwd=tmp_path).stdout == before, "the install replaced the stack's torch"
    where = _run([py, "-c", "import grpo_replay, trl; print(grpo_replay.__file__)"], cwd=tmp_path, env=offline)
    assert where.returncode == 0 and Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout + where.stderr

    out = tmp_path / "smoke"
    smoke = _run([py, ROOT / "scripts/smoke_check.py", "--device", "cpu", "--dtype", "float32", "--steps", "3",
                  "--only", "trl", "--out", out], cwd=tmp_path, env=offline)
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
    assert "smoke_check: all invariants hold" in smoke.stdout
    train = _run([env_dir / "bin" / "grpo-replay", "train", "--steps", "2", "--no-progress", "--out", tmp_path / "run",
                  "--set", f"testbed.cache_dir={out / 'testbed-cache'}", "--set", "prompts_per_step=4",
                  "--set", "eval_every=0", "--set", "eval_problems=8", "--set", "eval_samples=1",
                  *[x for k, v in _tiny_testbed().items() for x in ("--set", f"{k}={v}")]],
                 cwd=tmp_path, env=offline)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()


def _tiny_testbed() -> dict:
    from grpo_replay.tasks.testbed.testbed_config import TINY_TESTBED

    return {k: json.dumps(v) if isinstance(v, list) else v for k, v in TINY_TESTBED.items()}
