"""The README is a product page whose map of the code is true, and no document or source file points outside the
repository."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PKG = ROOT / "src" / "grpo_replay"
DOCS = [README, *ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/**/README.md")]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def layout_block() -> list[str]:
    text = README.read_text()
    block = text.split("## Layout", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def tree_paths() -> list[Path]:
    """Every path the Layout block names: folders (ending in /) nest by indentation; a line may name several
    files of its folder before its comment (two spaces or more)."""
    out, stack = [], []
    for line in layout_block():
        indent = len(line) - len(line.lstrip())
        names = re.split(r"\s{2,}", line.strip())[0].split()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        base = ROOT.joinpath(*[s[1] for s in stack])
        for name in names:
            out.append(base / name.rstrip("/"))
        if len(names) == 1 and names[0].endswith("/"):
            stack.append((indent, names[0].rstrip("/")))
    return out


def test_readme_is_at_most_15_kb():
    assert README.stat().st_size <= 15 * 1024, f"README.md is {README.stat().st_size} bytes; move detail to docs/"


def test_every_path_in_the_layout_exists():
    paths = tree_paths()
    assert len(paths) > 20
    missing = [str(p.relative_to(ROOT)) for p in paths if not p.exists()]
    assert not missing, f"the README's Layout names paths that do not exist: {missing}"


def test_the_layout_names_every_module_and_package_of_the_top_level():
    named = {p.relative_to(ROOT) for p in tree_paths()}
    modules = {p.relative_to(ROOT) for p in PKG.glob("*.py") if p.name != "__init__.py"}
    packages = {p.parent.relative_to(ROOT) for p in PKG.glob("*/__init__.py")}
    top = {Path(name) for name in ("src", "tests", "benchmarks", "examples", "scripts", "docs")}
    named |= {parent for p in named for parent in p.parents}
    unnamed = sorted(str(p) for p in (modules | packages | top) - named)
    assert not unnamed, f"the README's Layout does not mention: {unnamed}"


def test_relative_links_resolve_inside_the_repository():
    bad = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+://|#|mailto:", target):
                continue
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not bad, "links that do not resolve inside the repository:\n" + "\n".join(bad)


def test_no_document_or_source_file_names_a_path_outside_the_repository():
    """Data and model locations come from arguments or $GRPO_REPLAY_DATA, never from the workspace around the
    checkout."""
    files = [*DOCS, *PKG.rglob("*.py"), *ROOT.glob("scripts/*"), *ROOT.glob("examples/**/*"),
             *ROOT.glob("benchmarks/*.py")]
    hits = []
    for f in files:
        if f.is_file() and f.suffix not in (".png",):
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if re.search(r"\.\./shared|/work/shared|shared/reference|METHOD\.md", line):
                    hits.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "paths outside the repository:\n" + "\n".join(hits)
