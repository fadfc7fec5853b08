"""scripts/gpu_check.sh (grpo_replay.preflight.gpu_check), the offline GPU check, in its CPU dry run: every check at
toy shapes through the script a user runs; the reports' structure; skips and failures say why; a CUDA request on a
machine without one is refused before any check."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import fresh_process_env, restore_after

from grpo_replay.preflight.gpu_check import __main__ as gpu_check
from grpo_replay.preflight.gpu_check.report import JSON_NAME, MD_NAME, STATUSES

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ["testbed", "memory", "scoring", "trl", "vllm"]


@pytest.fixture(autouse=True)
def _restore_offline_switches(monkeypatch):
    """main() turns the hub off in its own process's environment; a test's in-process call must not leave it so."""
    restore_after(monkeypatch, *gpu_check.OFFLINE, "CUDA_VISIBLE_DEVICES")


def _env() -> dict:
    return {**fresh_process_env(), "PYTHON": sys.executable}


def _check_reports(out: Path) -> dict:
    doc = json.loads((out / JSON_NAME).read_text())
    assert {"device", "torch", "transformers", "trl", "vllm", "offline", "summary", "checks"} <= set(doc)
    assert "HF_HUB_OFFLINE=1" in doc["offline"]
    for c in doc["checks"]:
        assert c["status"] in STATUSES and {"name", "title", "why", "seconds", "figures", "rows"} <= set(c)
        if c["status"] != "passed":
            assert len(c["why"]) > 20, c  # a skip or a failure says why
    assert doc["summary"] == {s: sum(c["status"] == s for c in doc["checks"]) for s in STATUSES}
    md = (out / MD_NAME).read_text()
    assert md.startswith("# GPU check")
    for c in doc["checks"]:
        assert f"| {c['name']} | **{c['status']}** |" in md
    return doc


@pytest.mark.slow
def test_the_dry_run_runs_every_check_at_toy_shapes(tmp_path):
    out = tmp_path / "check"
    run = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), str(out), "--device", "cpu", "--tiny"],
                         capture_output=True, text=True, timeout=600, env=_env(), cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = _check_reports(out)
    by = {c["name"]: c for c in doc["checks"]}
    assert list(by) == CHECKS
    assert all(by[n]["status"] == "passed" for n in CHECKS[:-1]), {n: by[n]["why"] for n in by}
    assert by["vllm"]["status"] == "skipped" and "not installed" in by["vllm"]["why"]  # the suite has no vLLM
    assert by["testbed"]["figures"]["steps"] == 2 and (out / "testbed" / "summary.json").is_file()
    phases = [r["phase"] for r in by["memory"]["rows"]]
    assert phases[:2] == ["weights", "scoring"] and len(phases) == 6
    assert all(r["preflight GiB"] > 0 and r["measured GiB"] is None for r in by["memory"]["rows"])  # CPU: no peak
    assert any("not measured on a CPU" in n for n in by["memory"]["notes"])
    replayed = by["trl"]["figures"]["rows reaching the loss (replayed among them)"]
    assert int(replayed.split("(")[1].rstrip(")")) > 0, replayed
    assert max(by["trl"]["figures"]["logged replay/count per step"]) > 0


def test_cuda_is_refused_where_there_is_none(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    run = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), str(tmp_path / "x")], capture_output=True,
                         text=True, timeout=300, env=_env())
    assert run.returncode == 2 and "torch sees no CUDA device" in run.stderr, run.stderr
    assert not (tmp_path / "x").exists()  # nothing made before the refusal


def test_bad_arguments_are_refused(tmp_path, capsys):
    for argv, said in ((["--only", "testbed,gpu"], "--only gpu: unknown; allowed: testbed, memory"),
                       (["--sizes", "4B"], "--sizes 4B: unknown; allowed: 0.6B, 1.7B")):
        with pytest.raises(SystemExit) as e:
            gpu_check.main(["--out", str(tmp_path / "o"), "--device", "cpu", *argv])
        assert e.value.code == 2 and said in capsys.readouterr().err


def test_a_failure_and_a_spent_budget_are_reported_with_why(tmp_path, monkeypatch):
    from grpo_replay.preflight.gpu_check import trl_replay

    def broken(res, out, device):
        raise RuntimeError("the trainer fell over")

    monkeypatch.setattr(trl_replay, "check", broken)
    out = tmp_path / "o"
    assert gpu_check.main(["--out", str(out), "--device", "cpu", "--tiny", "--only", "trl,vllm"]) == 3
    doc = _check_reports(out)
    assert [(c["name"], c["status"]) for c in doc["checks"]] == [("trl", "failed"), ("vllm", "skipped")]
    assert doc["checks"][0]["why"] == f"RuntimeError: the trainer fell over (traceback: {out / 'trl-traceback.txt'})"
    assert "the trainer fell over" in (out / "trl-traceback.txt").read_text()
    out = tmp_path / "budget"
    assert gpu_check.main(["--out", str(out), "--device", "cpu", "--tiny", "--only", "memory,trl", "--budget", "-1"]) == 0
    doc = _check_reports(out)
    assert all(c["status"] == "skipped" and "time budget" in c["why"] for c in doc["checks"])


def test_the_documented_commands_are_accepted(tmp_path):
    """docs/gpu.md's and the script's own usage lines parse: OUT first, then the module's flags."""
    import shlex

    lines = [ln.split("#")[0] for ln in (ROOT / "docs/gpu.md").read_text().splitlines()
             if ln.startswith("bash scripts/gpu_check.sh")]
    lines.append("bash scripts/gpu_check.sh OUT --device cpu --tiny")  # the script's header: the dry run
    assert len(lines) >= 2
    for line in lines:
        args = shlex.split(line)[2:]
        out, rest = (args[0], args[1:]) if args and not args[0].startswith("-") else ("runs/x", args)
        a = gpu_check.parse(["--out", str(tmp_path / out), *rest])
        assert a.only == CHECKS or a.tiny


def test_the_trl_check_fails_when_no_replay_row_reaches_the_loss(tmp_path, monkeypatch):
    """With a warm-up as long as the run, nothing is replayed: the check must say so instead of passing."""
    import torch

    from grpo_replay.preflight.gpu_check import trl_replay
    from grpo_replay.preflight.gpu_check.report import run_check

    monkeypatch.setattr(trl_replay, "WARMUP_STEPS", 2)
    res = run_check("trl", "t", lambda r: trl_replay.check(r, tmp_path / "trl", torch.device("cpu")))
    assert res.status == "failed" and res.why.startswith("no replay row reached the loss (0 flagged rows"), res.why
