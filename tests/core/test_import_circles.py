"""No two modules of the package import each other, directly or round a loop, by any import: at module top, inside a
function, or under `TYPE_CHECKING`. A circle hidden by an import inside a function still ties the two files into
one piece that can only be read, tested and moved together; the fix is a third module both import.

Read statically (ast), so nothing of the package is imported. An import names a module file when one exists
(`from . import jobs` -> experiments/jobs.py), else the package (its `__init__.py`); importing a module also runs its
parents' `__init__.py`, which is not drawn as an arrow (every package would otherwise be one circle with its own
face).
"""
from __future__ import annotations

import ast
import functools
import shutil
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "src" / "grpo_replay"

KNOWN_CIRCLES: dict[frozenset[str], str] = {}
"""Circles tolerated for now, each with the reason it stays: {frozenset of dotted module names: why}. Empty."""


def module_name(path: Path, pkg: Path = PKG) -> str:
    """grpo_replay.a.b for pkg/a/b.py, grpo_replay.a for pkg/a/__init__.py."""
    parts = ["grpo_replay", *path.relative_to(pkg).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.AST, package: list[str], modules: set[str]) -> list[str]:
    """The dotted names an import statement asks for; `from X import n` names X.n when X.n is a module."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


@functools.lru_cache(maxsize=None)  # read once per process: the package does not change during a run
def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """{module: the package's modules it imports anywhere in its file} over every .py file under `pkg`."""
    files = {module_name(p, pkg): p for p in sorted(pkg.rglob("*.py"))}
    modules = set(files)
    graph = {}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _targets(node, package, modules):
                while target and target not in modules:  # grpo_replay.x.NAME -> grpo_replay.x
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected pieces of more than one module (Tarjan, iterative), each a circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                piece = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    piece.add(w)
                    if w == v:
                        break
                if len(piece) > 1:
                    found.append(frozenset(piece))
    return found


def _describe(piece: frozenset[str], graph: dict[str, set[str]]) -> str:
    arrows = [f"{a} -> {b}" for a in sorted(piece) for b in sorted(graph[a] & piece)]
    return "circle: " + "; ".join(arrows)


def test_no_module_of_the_package_is_on_an_import_circle():
    graph = import_graph()
    assert len(graph) > 100 and "grpo_replay.experiments.jobs" in graph["grpo_replay.experiments.report"]
    unknown = [_describe(c, graph) for c in circles(graph) if c not in KNOWN_CIRCLES]
    assert not unknown, ("modules import each other (move what both need into a third module they both import):\n"
                         + "\n".join(unknown))


def test_every_known_circle_is_still_there():
    """A circle listed as known that is gone is struck from the list, so the list never excuses a new one."""
    found = set(circles(import_graph()))
    assert not [sorted(c) for c in KNOWN_CIRCLES if c not in found]


def test_the_check_sees_a_circle_hidden_inside_a_function(tmp_path):
    """The check itself: a copy of the package where budget_picks imports alternatives inside a function (which
    imports budget_picks at its top) and buffer imports session under TYPE_CHECKING is refused, naming both."""
    copy = tmp_path / "grpo_replay"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    picks = copy / "experiments" / "budget_picks.py"
    picks.write_text(picks.read_text() + "\n\ndef _lazy():\n    from .alternatives import AXES\n    return AXES\n")
    buffer = copy / "buffer.py"
    buffer.write_text(buffer.read_text() + "\nif False:  # TYPE_CHECKING\n    from .session import ReplaySession\n")
    graph = import_graph(copy)
    found = {frozenset(n.rpartition(".")[2] for n in c) for c in circles(graph)}
    assert frozenset({"alternatives", "budget_picks"}) in found
    assert any({"buffer", "session"} <= c for c in found), found
