"""`replay.max_drift` has one rule, the core's `session.over_drift_bound` (a replayed row whose drift is strictly
above the bound): every engine's comparison calls it. A restated comparison (`drift > max_drift` in an adapter,
`>=` in another) would let two trainers drop different rows on a tie, so any ordering comparison of a drift
anywhere in the package outside that function is refused, read statically (the verl adapters do not import here).
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "src" / "grpo_replay"
ORDERING = (ast.Gt, ast.GtE, ast.Lt, ast.LtE)
ALLOWED = {("session.py", "over_drift_bound"),  # the rule itself
           ("config.py", "__post_init__")}  # max_drift <= 0 is refused as a setting, not a row's drift


def _functions(tree: ast.AST):
    """(enclosing function name or '', node) for every node."""
    def walk(node, name):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
            yield inner, child
            yield from walk(child, inner)
    yield from walk(tree, "")


def _names(node: ast.AST) -> list[str]:
    """The lower-cased names, attributes and string constants in `node`."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.append(n.id.lower())
        elif isinstance(n, ast.Attribute):
            out.append(n.attr.lower())
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value.lower())
    return out


def drift_comparisons(pkg: Path = PKG) -> list[str]:
    """file:line and text of every <, <=, >, >= whose operands mention a drift (not the drift probe's step count)
    outside `ALLOWED`."""
    out = []
    for path in sorted(pkg.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(pkg).as_posix()
        for func, node in _functions(ast.parse(text)):
            if not isinstance(node, ast.Compare) or not any(isinstance(op, ORDERING) for op in node.ops):
                continue
            if (rel, func) not in ALLOWED and any("drift" in n and "drift_probe" not in n for n in _names(node)):
                out.append(f"{rel}:{node.lineno} ({func or 'module'}): {ast.get_source_segment(text, node)}")
    return out


def test_every_drift_threshold_is_the_core_rule():
    found = drift_comparisons()
    assert not found, ("a drift compared with its bound outside `session.over_drift_bound`; call it instead:\n"
                       + "\n".join(found))


def test_the_allowed_places_exist():
    """Each allowed place still holds its comparison, so the list cannot outlive what it excuses."""
    for rel, func in ALLOWED:
        tree = ast.parse((PKG / rel).read_text())
        defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == func]
        assert defs and any(isinstance(n, ast.Compare) for n in ast.walk(defs[0])), (rel, func)


def test_the_check_sees_a_restated_rule(tmp_path):
    """The check itself: an adapter that writes `drift >= max_drift` is named."""
    pkg = tmp_path / "grpo_replay"
    (pkg / "integrations").mkdir(parents=True)
    (pkg / "integrations" / "engine.py").write_text(
        "def drop(drift, config):\n    return drift >= config.max_drift\n")
    assert drift_comparisons(pkg) == ["integrations/engine.py:2 (drop): drift >= config.max_drift"]
