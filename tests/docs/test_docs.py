"""The documentation runs as written: every tagged snippet in README.md, docs/*.md and examples/**/README.md.

A fence's info string says what it is (GitHub renders only the first word, the language):
- ```` ```bash run ```` / ```` ```python run ````: run by this test in a fresh temporary directory that mirrors the
  repository root (its files linked, ``../shared`` linked beside it), with ``.venv/bin`` first on PATH.
  ``args="..."`` is appended to every line that calls ``grpo-replay`` or a ``benchmarks/`` script (the small
  settings that keep CI fast, passed through the command's own documented flags); ``skip="PREFIX | PREFIX"`` with
  ``why="..."`` leaves out the lines that start with one of the prefixes (a server, the test suite itself), so the
  commands a reader sees carry no test markup. ``timeout=N`` (seconds) overrides the default.
- ```` ```bash manual why="..." ````: a command nobody runs unattended (hours of compute, a multi-GB download); the
  reason is required.
- ```` ```bash gpu ````, ```` ```bash hub ````, ```` ```bash cluster ````, ```` ```python gpu ```` ...: needs a GPU, the
  Hugging Face hub or several machines; the fence next to it must be a ``run`` fence (its CPU variant).
- ```` ```bash ci ````: CI itself runs it (the test suite; running it here would recurse).
- ```` ```text ````, ```` ```yaml ```` and other languages: output or configuration, not run.
Every bash/sh/python fence must carry one of these tags: an untagged command is a snippet nobody checks.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("examples/**/README.md")])
RUNNABLE_LANGS = {"bash", "sh", "console", "python", "py"}
NOT_RUN_TAGS = {"gpu", "hub", "cluster"}
TAGS = {"run", "ci", "manual"} | NOT_RUN_TAGS
FENCE = re.compile(r"^```([A-Za-z]*)([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
DEFAULT_TIMEOUT = 300


@dataclass
class Snippet:
    path: Path
    line: int
    lang: str
    tag: str | None
    attrs: dict[str, str]
    body: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse_snippets(path: Path) -> list[Snippet]:
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        lang, info, body = m.group(1).lower(), m.group(2), m.group(3)
        words = shlex.split(info)
        tag = next((w for w in words if w in TAGS), None)
        attrs = dict(w.split("=", 1) for w in words if "=" in w)
        out.append(Snippet(path, text.count("\n", 0, m.start()) + 1, lang, tag, attrs, body))
    return out


ALL = [s for p in DOCS for s in parse_snippets(p)]
RUN = [s for s in ALL if s.tag == "run"]


def test_every_command_snippet_is_tagged():
    untagged = [s.id for s in ALL if s.lang in RUNNABLE_LANGS and s.tag is None]
    assert not untagged, f"untagged bash/python fences (tag them run, ci, gpu, hub or cluster): {untagged}"
    assert len(RUN) >= 5, "the docs should hold runnable snippets"


def test_skipped_lines_and_manual_fences_say_why_and_visible_commands_carry_no_test_markup():
    for s in ALL:
        if s.tag == "manual" or "skip" in s.attrs:
            assert s.attrs.get("why"), f"{s.id}: a manual fence or a skip= needs why=\"...\""
        for prefix in skip_prefixes(s):
            assert any(line.strip().startswith(prefix) for line in s.body.splitlines()), (
                f"{s.id}: skip={prefix!r} matches no line of the fence")
        assert "doctest" not in s.body, f"{s.id}: test markup in a visible command; use the fence's skip= instead"


def test_every_gpu_hub_or_cluster_snippet_has_a_cpu_variant_beside_it():
    for p in DOCS:
        snippets = [s for s in parse_snippets(p) if s.lang in RUNNABLE_LANGS]
        for i, s in enumerate(snippets):
            if s.tag in NOT_RUN_TAGS:
                beside = snippets[max(0, i - 1) : i] + snippets[i + 1 : i + 2]
                assert any(b.tag in ("run", "ci") for b in beside), (
                    f"{s.id} needs a {s.tag}; the fence before or after it must be its CPU variant, tagged run"
                )


def test_parser_reads_tags_and_attributes(tmp_path):
    md = tmp_path / "x.md"
    md.write_text('text\n```bash run args="--set steps=2" timeout=9\ngrpo-replay train\n```\n```python\nx\n```\n')
    a, b = parse_snippets(md)
    assert (a.lang, a.tag, a.attrs, a.body, a.line) == ("bash", "run", {"args": "--set steps=2", "timeout": "9"},
                                                         "grpo-replay train\n", 2)
    assert (b.lang, b.tag) == ("python", None)


def skip_prefixes(s: Snippet) -> list[str]:
    return [p.strip() for p in s.attrs.get("skip", "").split("|") if p.strip()]


def shell_script(s: Snippet) -> str:
    """The snippet's lines, `args` appended to each grpo-replay call, skipped lines dropped."""
    extra = s.attrs.get("args", "")
    skip = skip_prefixes(s)
    lines, joined = [], ""
    for raw in s.body.splitlines():
        joined += raw
        if raw.rstrip().endswith("\\"):  # a continued command is one command
            joined = joined.rstrip()[:-1].rstrip() + " "
            continue
        line, joined = joined, ""
        if any(line.strip().startswith(p) for p in skip):
            continue
        if extra and re.search(r"(^|[\s/])grpo-replay\s|benchmarks/\S+\.py", line + " "):
            code, hash_, comment = line.partition(" #")
            line = with_args(code.rstrip(), extra) + (f" #{comment}" if hash_ else "")
        lines.append(line)
    return "set -euo pipefail\n" + "\n".join(lines) + "\n"


def with_args(code: str, extra: str) -> str:
    """`code` with each setting of `extra` put in: a `--set KEY=V` or `--flag V` the command already has gets the new
    value in place (the command refuses a key given twice), anything else is appended."""
    toks, out = shlex.split(extra), []
    i = 0
    while i < len(toks):
        flag = toks[i]
        value = toks[i + 1] if i + 1 < len(toks) and not toks[i + 1].startswith("--") else None
        i += 2 if value is not None else 1
        if flag == "--set" and value is not None:
            key = value.split("=", 1)[0]
            pattern = rf"(--set\s+){re.escape(key)}=\S+"
            repl = f"--set {shlex.quote(value)}"
        elif value is not None:
            pattern, repl = rf"{re.escape(flag)}\s+(?!--)\S+", f"{flag} {shlex.quote(value)}"
        else:
            pattern, repl = rf"{re.escape(flag)}(?=\s|$)", flag
        if re.search(pattern, code):
            code = re.sub(pattern, lambda _m: repl, code, count=1)
        else:
            out += [flag] + ([shlex.quote(value)] if value is not None else [])
    return " ".join([code, *out]) if out else code


def test_shell_script_appends_args_and_skips(tmp_path):
    s = Snippet(ROOT / "README.md", 1, "bash", "run", {"args": "--set steps=2", "skip": "bash scripts/test.sh | x",
                                                        "why": "recursion"},
                "grpo-replay train --seed 1   # a comment\nbash scripts/test.sh  # the suite\n"
                "grpo-replay eval --model m \\\n    --n 2\nx --y\n")
    assert shell_script(s).splitlines()[1:] == [
        "grpo-replay train --seed 1 --set steps=2 # a comment",
        "grpo-replay eval --model m     --n 2 --set steps=2",
    ]


def test_args_replace_a_setting_the_command_already_has():
    """The CLI refuses a key given twice, so a budget in `args` replaces the documented value instead of following it."""
    assert with_args("grpo-replay train --set max_new_tokens=16 --steps 5 --no-progress",
                     "--set max_new_tokens=8 --steps 2 --set lr=1e-3 --no-progress --seeds 1") == (
        "grpo-replay train --set max_new_tokens=8 --steps 2 --no-progress --set lr=1e-3 --seeds 1")


def sandbox(tmp_path: Path) -> Path:
    """A fresh directory laid out like the checkout: every top-level entry linked, ../shared beside it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in {".git", "runs", "checkpoints", ".pytest_cache", ".hypothesis"}:  # run folders: its own
            (repo / entry.name).symlink_to(entry)
    shared = ROOT.parent / "shared"
    if shared.exists():
        (tmp_path / "shared").symlink_to(shared)
    return repo


@pytest.mark.parametrize("snippet", RUN, ids=[s.id for s in RUN])
def test_snippet_runs(snippet: Snippet, tmp_path):
    repo = sandbox(tmp_path)
    venv_bin = ROOT / ".venv" / "bin"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", MPLBACKEND="Agg",
               WANDB_MODE="offline", WANDB_SILENT="true",  # report_to=wandb without an account
               PATH=f"{venv_bin}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(ROOT / "src"))
    if snippet.lang in ("python", "py"):
        cmd = [sys.executable, "-c", snippet.body]
    else:
        cmd = ["bash", "-c", shell_script(snippet)]
    timeout = int(snippet.attrs.get("timeout", DEFAULT_TIMEOUT))
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{snippet.id} failed (exit {proc.returncode}):\n{snippet.body}\n--- stdout ---\n{proc.stdout[-3000:]}\n"
        f"--- stderr ---\n{proc.stderr[-5000:]}"
    )
    # The sandbox links the real .venv: a snippet that reinstalls the project from the sandbox would leave every
    # later test importing a temporary copy (it happened: setup.sh once ran `pip install -e .` from here).
    # Read from the install record (pip's direct_url.json) rather than by importing: an import costs 3 s a snippet.
    assert installed_from() == ROOT.as_uri(), f"{snippet.id} repointed the installed project to {installed_from()}"


def installed_from() -> str | None:
    """The source `.venv`'s grpo-replay was installed from (its direct_url.json), or None when not installed."""
    for record in (ROOT / ".venv").glob("lib/python*/site-packages/grpo_replay-*.dist-info/direct_url.json"):
        return json.loads(record.read_text()).get("url")
    return None
