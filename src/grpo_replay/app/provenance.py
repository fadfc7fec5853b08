"""Which code produced a result: commit, package and torch versions, Python, machine.

Every committed figure must be traceable to the code it came from, so reports, run summaries and benchmark
outputs record `provenance()`. A wheel install has no git checkout; the commit then reads "unknown (no git
checkout)" rather than guessing.
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


def provenance() -> dict[str, str]:
    """commit, grpo_replay / torch / Python versions and the machine, as strings (JSON-ready)."""
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:  # the report-only paths do not need torch
        torch_version = "not installed"
    return {"commit": git_commit(), "grpo_replay": __version__, "torch": torch_version,
            "python": platform.python_version(), "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}"}


def describe(p: dict[str, str] | None = None) -> str:
    """One line for a report: `commit abc1234, grpo-replay 0.1.0, torch 2.13.0, Python 3.11.7, 2 CPU cores, x86_64`."""
    p = p or provenance()
    return (f"commit `{p['commit']}`, grpo-replay {p['grpo_replay']}, torch {p['torch']}, Python {p['python']}, "
            f"{p['machine']}")


UNRECORDED = "not recorded"  # the run_commits key of runs whose summary.json has no provenance


def run_commits_line(counts: dict[str, int], report_commit: str | None) -> str | None:
    """A report's sentence on the code its runs were made with, or None when every run was made at `report_commit`.

    A compare reuses finished run directories, so a report regenerated later (or extended with more seeds) holds runs
    that an older commit made; its own "Code:" line names only the commit that wrote the report."""
    if not counts or set(counts) == {report_commit}:
        return None
    runs = lambda n: f"{n} run{'s' if n != 1 else ''}"  # noqa: E731
    known = sorted(((c, n) for c, n in counts.items() if c != UNRECORDED), key=lambda kv: (-kv[1], kv[0]))
    parts = []
    if known:
        parts.append("Its runs were made at commit " + ", ".join(f"`{c}` ({runs(n)})" for c, n in known)
                     + "; each run's summary.json records its own")
    if counts.get(UNRECORDED):
        parts.append(f"{runs(counts[UNRECORDED])} did not record the code that made {'them' if counts[UNRECORDED] != 1 else 'it'}"
                     " (made before runs recorded it)")
    return ". ".join(parts) + "."
