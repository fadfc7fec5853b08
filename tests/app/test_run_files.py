"""A run directory's file names are spelled once, in `app.run_files`: every writer and reader of a run takes them
from there, so a renamed file cannot leave a reader looking for the old name."""
from __future__ import annotations

import ast
from pathlib import Path

from grpo_replay.app import run_files

PKG = Path(__file__).resolve().parents[2] / "src" / "grpo_replay"
NAMES = {v for k, v in vars(run_files).items() if k.isupper() and isinstance(v, str) and not k.endswith("PREFIX")}
PREFIXES = (run_files.CHECKPOINT_PREFIX, run_files.TRL_CHECKPOINT_PREFIX)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def spelled_run_files(pkg: Path) -> list[str]:
    """file:line of every string literal outside app/run_files.py that is a run file's name or a path through one
    (`x/summary.json`), or a checkpoint folder's name or glob (`ckpt-*`, `checkpoint-`). A name without a dot
    (`final`, `bench`, `wandb`: also plain words and keys) counts where a path is joined to it (`run_dir / "final"`)."""
    found = []
    for path in sorted(pkg.rglob("*.py")):
        if path == pkg / "app" / "run_files.py":
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        joined = {id(n.right) for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
                continue
            parts = node.value.split("/")
            named = any(p in NAMES and ("." in p or id(node) in joined) for p in parts)
            if named or any(p.startswith(PREFIXES) for p in parts) or node.value.endswith(PREFIXES):
                found.append(f"{path.relative_to(pkg)}:{node.lineno}: {node.value!r}")
    return found


def test_no_run_file_name_is_spelled_outside_run_files():
    found = spelled_run_files(PKG)
    assert not found, "spell these with app.run_files' names:\n" + "\n".join(found)


def test_the_check_sees_a_spelled_name(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "reader.py").write_text('"""Reads summary.json and final/."""\n'
                                        'def f(d):\n    return d / "summary.json", d.glob("ckpt-*"), f"x ckpt-{d}", '
                                        '{"final": 1}, d / "final"\n')
    found = sorted(f.split(": ")[1] for f in spelled_run_files(tmp_path))
    assert found == ["'ckpt-*'", "'final'", "'summary.json'", "'x ckpt-'"]


def test_old_run_directories_are_adopted_by_the_same_names():
    """The names a run directory made before the marker existed may hold (`is_ours`), and what is not one."""
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "trl_summary.json", "final", "accuracy.png",
                 "wandb_run_id", "checkpoint-12", "ckpt-000004", "ckpt-000004.tmp", ".grpo-replay.lock"):
        assert run_files.is_ours(name), name
    for name in ("README.md", "checkpoint-", "ckpt-x", "notes.txt", "finals"):
        assert not run_files.is_ours(name), name
