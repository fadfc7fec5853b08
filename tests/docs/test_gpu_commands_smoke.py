"""scripts/gpu_smoke.sh on CPU: valid bash that refuses without a GPU, one line per path and exit 3 on a failure,
each path's preflight accepting its launch, and, with a stand-in python and nvidia-smi, every training path judged
on its realised replay share (tests/docs/test_gpu_commands.py checks the commands it prints)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpu_commands as gc

ROOT = gc.ROOT


# ------------------------------------------------------------------------------------------- gpu_smoke.sh
def test_gpu_smoke_is_valid_bash_and_refuses_without_a_gpu(tmp_path):
    for script in ("scripts/gpu_smoke.sh", "scripts/setup_verl_gpu.sh", "examples/verl/run_paper_single_node.sh",
                   "examples/verl/run_paper_multi_node.sh"):
        assert subprocess.run(["bash", "-n", script], cwd=ROOT).returncode == 0, script
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")  # a driver tool that lists no GPU
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GPU_SMOKE_VENV": str(tmp_path / "venv"),
           "VERL_GPU_VENV": str(tmp_path / "verl-venv")}
    env.pop("GPU_SMOKE_DRY_RUN", None)
    out = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "out")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert "no NVIDIA GPU found" in out.stderr and "bash scripts/test.sh" in out.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "venv").exists()  # nothing made or installed
    bad = subprocess.run(["bash", "scripts/gpu_smoke.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**env, "GPU_SMOKE_PATHS": "builtin vlm"})
    assert bad.returncode == 2 and "unknown path 'vlm'" in bad.stderr
    assert "allowed: testbed builtin trl trl-async verl" in bad.stderr


def test_gpu_smoke_reports_one_line_per_path_and_exit_3_on_a_failure(tmp_path):
    """With a GPU listed and a stand-in python (exit 0, then 1), each path gets its line and its log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    py = bin_dir / "fake-python"
    py.write_text("#!/bin/sh\necho \"ran $*\"\nexit ${FAKE_RC:-0}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(py),
           "GPU_SMOKE_PATHS": "testbed builtin"}
    env.pop("GPU_SMOKE_DRY_RUN", None)
    ok = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "ok")], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=60)
    lines = ok.stdout.splitlines()
    assert ok.returncode == 0 and [l.split()[:2] for l in lines] == [["testbed", "ok"], ["builtin-preflight", "ok"],
                                                                      ["builtin", "ok"], ["builtin-share", "ok"]], ok
    assert "grpo_replay.cli train" in (tmp_path / "ok" / "builtin.log").read_text()
    bad = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "bad")], cwd=ROOT, env={**env, "FAKE_RC": "1"},
                         capture_output=True, text=True, timeout=60)
    # a refused preflight skips its path: nothing of it runs on the GPU
    assert bad.returncode == 3 and [l.split()[:2] for l in bad.stdout.splitlines()] == [["testbed", "FAILED"],
                                                                                      ["builtin-preflight", "FAILED"]]
    assert f"log {tmp_path / 'bad' / 'builtin-preflight.log'}" in bad.stdout


def test_gpu_smoke_preflights_pass_on_cpu(smoke, tmp_path, capsys):
    """Each GPU path's own preflight (run first by gpu_smoke.sh) accepts its launch, checked here for one 80 GB
    card; the verl path's data is what its verl-data step writes (stand-in files here)."""
    from grpo_replay.cli import main

    for name in ("builtin-preflight", "trl-preflight", "trl-async-preflight", "verl-preflight"):
        argv = smoke[name]
        i = argv.index("preflight")
        launch = [a.replace(str(ROOT / "runs"), str(tmp_path)) for a in argv[i + 1:]]
        for a in launch:
            if a.startswith("DATA="):
                Path(a[5:]).mkdir(parents=True, exist_ok=True)
                for split in ("train", "test"):
                    (Path(a[5:]) / f"{split}.parquet").write_bytes(b"")
        code = main(["preflight", "--gpu-memory", "80", *launch])
        assert code == 0, (name, capsys.readouterr())


def test_gpu_smoke_takes_an_absolute_verl_venv(tmp_path):
    """The verl path puts VERL_GPU_VENV's bin first on PATH whether it is absolute or relative to the checkout."""
    for venv, want in ((str(tmp_path / "verl-gpu"), str(tmp_path / "verl-gpu/bin")),
                       (".venv-verl-gpu", str(ROOT / ".venv-verl-gpu/bin"))):
        out = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, env={**os.environ, "GPU_SMOKE_DRY_RUN": "1",
                                                         "VERL_GPU_VENV": venv, "GPU_SMOKE_PATHS": "verl"})
        verl = next(line.split("\t")[1:] for line in out.stdout.splitlines() if line.startswith("verl\t"))
        path = next(a for a in verl if a.startswith("PATH="))
        assert path.removeprefix("PATH=").split(":")[0] == want, path


def test_setup_verl_gpu_builds_flash_attn_for_the_host_gpu_only(tmp_path):
    """The flash-attn build gets the host's architecture (nvidia-smi's compute_cap 9.0 -> 90), not every one."""
    venv, bin_dir = tmp_path / "venv", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    rec = tmp_path / "pip.log"
    py = venv / "bin/python"
    py.write_text(f"#!/bin/sh\necho \"$FLASH_ATTN_CUDA_ARCHS|$TORCH_CUDA_ARCH_LIST|$*\" >> {rec}\n")
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 9.0\necho 9.0\n")
    for f in (py, smi):
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "VERL_GPU_VENV": str(venv)}
    for k in ("FLASH_ATTN_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST"):
        env.pop(k, None)
    out = subprocess.run(["bash", "scripts/setup_verl_gpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    (flash,) = [line for line in rec.read_text().splitlines() if "flash-attn==" in line]
    assert flash.startswith("90|9.0|"), flash
    assert "FLASH_ATTN_CUDA_ARCHS=90" in out.stderr


# The stand-in python of the runs below: it writes the run's log as the engine would (metrics.jsonl, TRL's
# trainer_state.json, verl's file logger at VERL_FILE_LOGGER_PATH when trainer.logger names "file"), serves /health
# as the vLLM server until stopped, and runs the real share checker.
_FAKE_PYTHON = """#!{python}
import json, os, sys, pathlib, subprocess
args = sys.argv[1:]
if args and args[0] == "scripts/check_replay_share.py":
    sys.exit(subprocess.run([{python!r}, *args]).returncode)
if "preflight" in args or args[:1] == ["-"]:  # a preflight; the verl-data step's script on stdin
    sys.exit(0)
if args[:2] == ["-m", "vllm.entrypoints.cli.main"]:
    import http.server
    pathlib.Path(os.environ["FAKE_SERVER_PID"]).write_text(str(os.getpid()))
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Health).serve_forever()
if os.environ.get("FAKE_TRAIN_RC"):
    sys.exit(int(os.environ["FAKE_TRAIN_RC"]))
shares = [float(x) for x in os.environ["FAKE_SHARES"].split()]
rows = [{{"step": i + 1, "replay/share": s, "replay/count": 8.0 * s / (1 - s)}} for i, s in enumerate(shares)]
if args[:2] == ["-m", "grpo_replay.integrations.verl.main"]:
    loggers = [a for a in args if a.startswith("trainer.logger=")][-1]
    if '"file"' in loggers:
        pathlib.Path(os.environ["VERL_FILE_LOGGER_PATH"]).write_text(
            "".join(json.dumps({{"step": r["step"], "data": r}}) + "\\n" for r in rows))
    sys.exit(0)
out = pathlib.Path(args[args.index("--out" if "--out" in args else "--output_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
if "--out" in args:
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
else:
    (out / "trainer_state.json").write_text(json.dumps({{"log_history": rows}}))
"""


def _fake_gpu_host(tmp_path, gpus: int = 2) -> dict:
    """nvidia-smi listing `gpus` GPUs, the stand-in python (also verl's environment's), a free server port."""
    import socket

    bin_dir = tmp_path / "bin"
    (tmp_path / "verl-venv/bin").mkdir(parents=True)
    bin_dir.mkdir()
    smi = "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})'\n" for i in range(gpus))
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + smi)
    py = bin_dir / "fake-python"
    py.write_text(_FAKE_PYTHON.format(python=sys.executable))
    (tmp_path / "verl-venv/bin/python").write_text(py.read_text())
    for f in (*bin_dir.iterdir(), tmp_path / "verl-venv/bin/python"):
        f.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(py),
           "VERL_GPU_VENV": str(tmp_path / "verl-venv"), "GPU_SMOKE_VLLM_PORT": str(port),
           "FAKE_SERVER_PID": str(tmp_path / "server.pid")}
    env.pop("GPU_SMOKE_DRY_RUN", None)
    return env


def _server_gone(tmp_path) -> bool:
    pid = int((tmp_path / "server.pid").read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("path", ["builtin", "trl", "trl-async", "verl"])
def test_gpu_smoke_fails_a_run_that_replays_nothing(tmp_path, path):
    """Every training path passes on its realised replay share, not on the exit code: a stand-in run that exits 0
    having replayed nothing (or a third short of the ratio) fails its share line and the script (exit 3); one that
    replayed ratio/(1+ratio) passes. The trl-async path's server is up before its run and gone after it."""
    env = {**_fake_gpu_host(tmp_path), "GPU_SMOKE_PATHS": path}
    before = {"trl-async": [["trl-async-preflight", "ok"], ["trl-async-server", "ok"]],
              "verl": [["verl-data", "ok"], ["verl-preflight", "ok"]]}.get(path, [[f"{path}-preflight", "ok"]])
    for shares, rc in (("0 0 0", 3), ("0 0.2222 0.2222", 3), ("0 0.3333 0.3333", 0)):
        out = tmp_path / f"out-{rc}-{shares.replace(' ', '_')}"
        run = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(out)], cwd=ROOT, capture_output=True, text=True,
                             timeout=120, env={**env, "FAKE_SHARES": shares})
        lines = [l.split()[:2] for l in run.stdout.splitlines()]
        assert lines == [*before, [path, "ok"], [f"{path}-share", "ok" if rc == 0 else "FAILED"]], (shares, run)
        assert run.returncode == rc, (shares, run)
        if rc:
            assert "check_replay_share" in (out / f"{path}-share.log").read_text()
        if path == "trl-async":
            assert _server_gone(tmp_path)


def test_gpu_smoke_trl_async_stops_its_server_when_the_run_fails(tmp_path):
    env = {**_fake_gpu_host(tmp_path), "GPU_SMOKE_PATHS": "trl-async", "FAKE_TRAIN_RC": "1"}
    run = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env=env)
    assert [l.split()[:2] for l in run.stdout.splitlines()] == [["trl-async-preflight", "ok"],
                                                                ["trl-async-server", "ok"], ["trl-async", "FAILED"]]
    assert run.returncode == 3 and _server_gone(tmp_path), run


def test_gpu_smoke_skips_trl_async_on_one_gpu(tmp_path):
    """One GPU: the preflight runs, the path is skipped with its reason, no server is started, the script passes."""
    env = {**_fake_gpu_host(tmp_path, gpus=1), "GPU_SMOKE_PATHS": "trl-async"}
    run = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env=env)
    lines = run.stdout.splitlines()
    assert [l.split()[:2] for l in lines] == [["trl-async-preflight", "ok"], ["trl-async", "skipped"]], run
    assert "needs 2 GPUs" in lines[1] and run.returncode == 0
    assert not (tmp_path / "server.pid").exists() and not (tmp_path / "out/trl-async-server.log").exists()

