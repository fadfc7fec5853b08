"""The verl preflight run by the launch's own python, where this one has no verl.

A launcher runs `python -m grpo_replay.integrations.verl.main` with the python first on its PATH (the verl
environment: `PATH=$PWD/.venv-verl-gpu/bin:$PATH bash examples/verl/...`). When this process cannot import verl,
the checks that need it (Hydra's composition and the entry point's own `launch_checks`) can still run in that
python: `run_there` starts it on `main` with the launch's overrides and this host's GPU facts, and its report is
the launch's. Where that python has no verl either, the caller reads the overrides without it and says so.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Optional

from .host import Host
from .report import Refusal, Report

MARK = "grpo-replay-preflight-report: "


def can_compose_here() -> bool:
    import importlib.util

    return importlib.util.find_spec("verl") is not None and importlib.util.find_spec("hydra") is not None


def run_there(python: str, overrides: list[str], host: Host, gpu_memory: Optional[int], launch: str,
              timeout: float = 600) -> Optional[Report]:
    """The report computed by `python` (the launch's), or None when it cannot compute one (it is this python, or
    it has no verl or no grpo_replay)."""
    if not python or os.path.abspath(python) == os.path.abspath(sys.executable):  # (venvs share the interpreter file)
        return None
    payload = json.dumps({"overrides": overrides, "host": dataclasses.asdict(host), "gpu_memory": gpu_memory,
                          "launch": launch})
    code = "from grpo_replay.preflight.verl_launch import report_for_caller; report_for_caller()"
    try:
        proc = subprocess.run([python, "-c", code], input=payload, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)), None)
    if proc.returncode or line is None:
        return None
    data = json.loads(line[len(MARK):])
    report = Report(launch, sections=data["sections"], refusals=[Refusal(*r) for r in data["refusals"]])
    report.sections.setdefault("config", []).insert(0, f"checked by the launch's own python, {python} (verl "
                                                        f"{data['verl']} there; none here)")
    return report

