import subprocess

import pytest

from grpo_replay import __version__
from grpo_replay.app.provenance import cpu_kind, describe, git_commit, provenance, run_commits_line, run_cpu_kinds_line


def test_outside_a_checkout_the_commit_is_unknown_not_guessed(tmp_path):
    assert git_commit(tmp_path) == "unknown (no git checkout)"


def test_commit_and_uncommitted_src_changes(tmp_path):
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path,  # noqa: E731
                                    check=True, capture_output=True, text=True).stdout.strip()
    try:
        git("init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not available")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-qm", "one")
    head = git("rev-parse", "--short", "HEAD")
    assert git_commit(tmp_path) == head
    (tmp_path / "notes.md").write_text("outside src: not the result's code\n")
    assert git_commit(tmp_path) == head
    (tmp_path / "src" / "a.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == head + "+uncommitted src changes"


def test_provenance_names_versions():
    p = provenance()
    assert p["grpo_replay"] == __version__
    assert p["torch"].startswith("2.")
    line = describe(p)
    assert p["commit"] in line and f"grpo-replay {__version__}" in line


def test_run_commits_line_names_runs_older_code_made():
    assert run_commits_line({}, "abc") is None
    assert run_commits_line({"abc": 7}, "abc") is None  # every run made by the report's own code: nothing to add
    assert run_commits_line({"old": 1}, "abc") == "Its runs were made at commit `old` (1 run); each run's summary.json records its own."
    line = run_commits_line({"b": 2, "a": 2, "c": 5}, "c")
    assert line.startswith("Its runs were made at commit `c` (5 runs), `a` (2 runs), `b` (2 runs);")  # most first, ties by name


def test_runs_that_did_not_record_their_commit_are_counted_as_such():
    assert run_commits_line({"not recorded": 3}, "abc") == "3 runs did not record the code that made them (made before runs recorded it)."
    assert run_commits_line({"old": 2, "not recorded": 1}, "abc") == (
        "Its runs were made at commit `old` (2 runs); each run's summary.json records its own. "
        "1 run did not record the code that made it (made before runs recorded it).")


def test_provenance_names_the_cpu_kind():
    p = provenance()
    assert p["cpu"] and p["cpu"] != "unknown" and p["cpu_capability"] not in ("", "unknown")
    assert cpu_kind(p) == f"{p['cpu']} / {p['cpu_capability']}" and cpu_kind(p) in describe(p)
    old = {k: v for k, v in p.items() if k not in ("cpu", "cpu_capability")}  # a run made before it was recorded
    assert "/" not in describe(old).split("CPU cores")[1]


def test_the_cpu_capability_follows_aten_cpu_capability():
    import os
    import sys

    out = subprocess.run([sys.executable, "-c", "from grpo_replay.app.provenance import cpu_capability; print(cpu_capability())"],
                         env={**os.environ, "ATEN_CPU_CAPABILITY": "default"}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "DEFAULT"


def test_a_report_whose_runs_mix_cpu_kinds_says_so():
    assert run_cpu_kinds_line({}) is None and run_cpu_kinds_line({"AMD EPYC / AVX512": 6}) is None
    line = run_cpu_kinds_line({"AMD EPYC / AVX512": 4, "Intel Xeon / AVX512": 2})
    assert line.startswith("Its runs were made on more than one CPU kind: AMD EPYC / AVX512 (4 runs), Intel Xeon / AVX512 (2 runs).")
    assert "same-seed pair may mix machines" in line
