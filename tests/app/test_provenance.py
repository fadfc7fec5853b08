import subprocess

import pytest

from grpo_replay import __version__
from grpo_replay.app.provenance import describe, git_commit, provenance, run_commits_line


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
