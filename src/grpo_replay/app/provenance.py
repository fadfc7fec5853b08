"""Which code and machine produced a result: commit, package and torch versions, Python, cores, CPU kind.

Every committed figure must be traceable to the code it came from, so reports, run summaries and benchmark
outputs record `provenance()`. A wheel install has no git checkout; the commit then reads "unknown (no git
checkout)" rather than guessing. The CPU kind (model name and the vector kernels torch dispatches to) is recorded
because one seed gives identical floats only on one kind: another CPU model, or `ATEN_CPU_CAPABILITY`, changes them.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from .. import __version__

CHECKOUT = Path(__file__).resolve().parents[3]  # the repository root for an editable install / source tree


def git_commit(root: Path = CHECKOUT) -> str:
    """Short hash of HEAD, with "+uncommitted src changes" when src/ differs from it (the result's code is not HEAD's)."""
    if not (root / ".git").exists():
        return "unknown (no git checkout)"
    try:
        rev = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                                      stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src"], cwd=root,
                               stderr=subprocess.DEVNULL).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown (git failed)"
    return rev + ("+uncommitted src changes" if dirty else "")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, platform.processor() elsewhere), or "unknown"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_capability() -> str:
    """The vector kernels torch's CPU ops dispatch to (e.g. AVX512, AVX2; `ATEN_CPU_CAPABILITY` lowers it)."""
    try:
        import torch
        return str(torch.backends.cpu.get_cpu_capability())
    except (ImportError, AttributeError):
        return "unknown"


def cpu_kind(p: dict[str, str] | None = None) -> str:
    """`<model> / <capability>`: what must match for two runs of one seed to give the same floats (with the same
    code and packages)."""
    p = p or {"cpu": cpu_model(), "cpu_capability": cpu_capability()}
    return f"{p.get('cpu', 'unknown')} / {p.get('cpu_capability', 'unknown')}"


def provenance() -> dict[str, str]:
    """commit, grpo_replay / torch / Python versions, the machine and its CPU kind, as strings (JSON-ready)."""
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:  # the report-only paths do not need torch
        torch_version = "not installed"
    return {"commit": git_commit(), "grpo_replay": __version__, "torch": torch_version,
            "python": platform.python_version(), "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}",
            "cpu": cpu_model(), "cpu_capability": cpu_capability()}


def describe(p: dict[str, str] | None = None) -> str:
    """One line for a report: `commit abc1234, grpo-replay 0.1.0, torch 2.13.0, Python 3.11.7, 2 CPU cores, x86_64,
    AMD EPYC / AVX512` (runs recorded before the CPU kind was: without it)."""
    p = p or provenance()
    kind = f", {cpu_kind(p)}" if "cpu" in p else ""
    return (f"commit `{p['commit']}`, grpo-replay {p['grpo_replay']}, torch {p['torch']}, Python {p['python']}, "
            f"{p['machine']}{kind}")


UNRECORDED = "not recorded"


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"  # the run_commits key of runs whose summary.json has no provenance


def run_commits_line(counts: dict[str, int], report_commit: str | None) -> str | None:
    """A report's sentence on the code its runs were made with, or None when every run was made at `report_commit`.

    A compare reuses finished run directories, so a report regenerated later (or extended with more seeds) holds runs
    that an older commit made; its own "Code:" line names only the commit that wrote the report."""
    if not counts or set(counts) == {report_commit}:
        return None
    known = sorted(((c, n) for c, n in counts.items() if c != UNRECORDED), key=lambda kv: (-kv[1], kv[0]))
    parts = []
    if known:
        parts.append("Its runs were made at commit " + ", ".join(f"`{c}` ({_runs(n)})" for c, n in known)
                     + "; each run's summary.json records its own")
    if counts.get(UNRECORDED):
        parts.append(f"{_runs(counts[UNRECORDED])} did not record the code that made {'them' if counts[UNRECORDED] != 1 else 'it'}"
                     " (made before runs recorded it)")
    return ". ".join(parts) + "."


def run_cpu_kinds_line(counts: dict[str, int]) -> str | None:
    """A report's sentence when its runs were made on more than one CPU kind (None otherwise): the same seed then
    gives other floats, so a pair of runs of one seed may mix machines."""
    if len(counts) < 2:
        return None
    kinds = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ("Its runs were made on more than one CPU kind: " + ", ".join(f"{k} ({_runs(n)})" for k, n in kinds)
            + ". One seed gives other numbers on another kind, so a same-seed pair may mix machines.")
