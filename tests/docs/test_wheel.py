"""The package builds as a wheel that installs into a fresh virtual environment and exposes `grpo-replay`.

The fresh venv (with its own pip) gets the wheel with --no-deps; its dependencies (torch, transformers, ...) are borrowed from the
test environment's site-packages through a plain path entry placed AFTER the venv's own site-packages, so
`grpo_replay` must come from the wheel (a path entry does not run the editable install's .pth hook, so the
checkout cannot leak in). A full install with dependencies is the same `pip install WHEEL` without --no-deps.
"""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (whl,) = out.glob("grpo_replay-*.whl")
    return whl


def test_wheel_holds_the_package_and_its_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "grpo_replay/cli/__init__.py" in names and "grpo_replay/errors.py" in names
    assert "grpo_replay/integrations/verl/config/replay/paper.yaml" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "grpo-replay = grpo_replay.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
    assert not [n for n in names if n.startswith("tests/")], "tests must not ship in the wheel"


def test_wheel_installs_in_a_fresh_venv_and_exposes_the_command(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)  # its own pip: nothing touches the test env
    py = env_dir / "bin" / "python"
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    # The fresh venv's own pip (never the test env's: `pip --prefix` would uninstall the checkout's editable install).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_PREFIX", "PIP_TARGET")}
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (site / "zz_borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run([str(py), "-c", "import grpo_replay; print(grpo_replay.__file__)"], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=300)
    assert where.returncode == 0, where.stderr[-3000:]
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout
    cmd = env_dir / "bin" / "grpo-replay"
    assert cmd.exists(), "the wheel's console script was not installed"
    for args in (["--help"], ["train", "--list-keys"]):
        run = subprocess.run([str(py), str(cmd), *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                             timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
    assert "replay.tau_max" in run.stdout
