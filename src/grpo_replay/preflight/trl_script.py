"""A TRL script read without running it: its `TrlParser((...))` dataclasses and the packages it imports.

The preflight must not execute the script (a script without a main guard would train, write files or load data at
import, and its own parser would read the preflight's command line). So the script is parsed with `ast`: the names
in its `TrlParser` call are resolved to the classes an installed package defines (`trl.ModelConfig`,
`grpo_replay.integrations.trl.ReplayGRPOConfig`: importing an installed library runs no code of the script), and a
dataclass the script (or a module beside it) defines is rebuilt from its source: field names, annotations and
literal defaults, on top of its resolved bases. Nothing of the script's folder is imported.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


class LaunchRefused(Exception):
    """The launch cannot run as given: `field` is the setting to change as the user typed it, `fix` how."""

    def __init__(self, field_name: str, problem: str, fix: str):
        super().__init__(problem)
        self.field, self.problem, self.fix = field_name, problem, fix


@dataclass
class ScriptSpec:
    path: Path
    classes: list[type]  # the TrlParser's dataclasses, in the script's order
    imports: dict[str, bool] = field(default_factory=dict)  # top-level module -> imported only under try/except
    notes: list[str] = field(default_factory=list)  # defaults the source does not state as literals


_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict, "List": list,
          "Dict": dict, "Any": Any}


def read_script(path: Path) -> ScriptSpec:
    """The script's parser dataclasses and imports, from its source alone (LaunchRefused when it has none)."""
    reader = _Reader(path)
    tree = reader.tree(path)
    names = _parser_names(tree)
    if names is None:
        raise LaunchRefused(str(path), "the script builds no TrlParser((...)) of its dataclasses, so its "
                               "settings cannot be read", "a script that parses its arguments with trl.TrlParser "
                               "(examples/trl/train_qwen3_math_replay.py), or the grpo-replay train form")
    spec = ScriptSpec(path, [reader.resolve(path, n) for n in names], notes=reader.notes)
    reader.collect_imports(path, spec.imports)
    return spec


def _parser_names(tree: ast.Module) -> Optional[list[ast.expr]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func).split(".")[-1] == "TrlParser":
            arg = node.args[0] if node.args else next((k.value for k in node.keywords
                                                       if k.arg == "dataclass_types"), None)
            if isinstance(arg, (ast.Tuple, ast.List)):
                return list(arg.elts)
            if arg is not None:
                return [arg]
    return None


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _name(node.func)
    return ""


class _Reader:
    def __init__(self, script: Path):
        self.folder = script.resolve().parent
        self.trees: dict[Path, ast.Module] = {}
        self.built: dict[tuple[Path, str], type] = {}
        self.notes: list[str] = []

    def tree(self, path: Path) -> ast.Module:
        if path not in self.trees:
            try:
                self.trees[path] = ast.parse(path.read_text(), filename=str(path))
            except SyntaxError as e:
                raise LaunchRefused(str(path), f"is not valid Python ({e.msg}, line {e.lineno})",
                                       "fix the script's syntax") from None
        return self.trees[path]

    def local_module(self, module: str) -> Optional[Path]:
        """The file of `module` when it lies in the script's folder (imported by the script, never by us)."""
        base = self.folder.joinpath(*module.split("."))
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file():
                return cand
        return None

    def resolve(self, path: Path, node: ast.expr) -> type:
        """The class `node` names in the file `path`."""
        dotted = _name(node)
        head, _, rest = dotted.partition(".")
        tree = self.tree(path)
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef) and stmt.name == dotted:
                return self.build(path, stmt)
        for stmt in ast.walk(tree):
            if isinstance(stmt, ast.ImportFrom) and stmt.module:
                for alias in stmt.names:
                    if (alias.asname or alias.name) == head and not rest:
                        return self.imported(path, stmt.module, alias.name, stmt.level)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == head and rest:
                        module, _, attr = f"{alias.name}.{rest}".rpartition(".")
                        return self.imported(path, module, attr, 0)
        raise LaunchRefused(dotted or ast.unparse(node), f"{path.name} passes {ast.unparse(node)} to TrlParser "
                               "but neither defines nor imports it at its top level", "a dataclass the script "
                               "defines or imports by name")

    def imported(self, path: Path, module: str, name: str, level: int) -> type:
        local = self.local_module(module) if level <= 1 else None
        if local is not None:  # a module beside the script: read, not imported
            return self.resolve(local, ast.Name(id=name))
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise LaunchRefused(f"{module}.{name}", f"{path.name} imports {name} from {module}, which is not "
                                   f"installed here ({e})", f"install the package that provides {module}") from None

    def build(self, path: Path, node: ast.ClassDef) -> type:
        """A dataclass like the one `node` defines: its fields' names, types and literal defaults, on its bases."""
        key = (path, node.name)
        if key in self.built:
            return self.built[key]
        if not any(_name(d).split(".")[-1] == "dataclass" for d in node.decorator_list):
            raise LaunchRefused(node.name, f"{path.name} passes the class {node.name} to TrlParser, which is not "
                                   "a @dataclass", "decorate it with @dataclass, as TrlParser needs")
        bases = tuple(self.resolve(path, b) for b in node.bases)
        fields = []
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if _name(stmt.annotation).split(".")[-1] == "ClassVar":
                    continue
                fields.append((stmt.target.id, self.annotation(stmt.annotation),
                               self.default(f"{node.name}.{stmt.target.id}", stmt.value)))
        cls = dataclasses.make_dataclass(node.name, fields, bases=bases, kw_only=True,
                                         namespace={"__module__": f"_preflight_{path.stem}"})
        self.built[key] = cls
        return cls

    def annotation(self, node: Optional[ast.expr]):
        if node is None:
            return str
        if isinstance(node, ast.Constant):
            return type(None) if node.value is None else self.annotation(ast.parse(node.value, mode="eval").body)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return typing.Union[self.annotation(node.left), self.annotation(node.right)]
        name = _name(node.value if isinstance(node, ast.Subscript) else node).split(".")[-1]
        if not isinstance(node, ast.Subscript):
            return _TYPES.get(name, str)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if name == "Literal":
            return typing.Literal[tuple(ast.literal_eval(a) for a in args)]
        inner = [self.annotation(a) for a in args]
        if name == "Optional":
            return typing.Optional[inner[0]]
        if name == "Union":
            return typing.Union[tuple(inner)]
        if name in ("list", "List"):
            return list[inner[0]]
        return _TYPES.get(name, str)

    def default(self, where: str, node: Optional[ast.expr]):
        if node is None:
            return dataclasses.field()
        if isinstance(node, ast.Call) and _name(node.func).split(".")[-1] == "field":
            kw = {k.arg: k.value for k in node.keywords}
            metadata = self.literal(where, kw["metadata"], {}) if "metadata" in kw else {}
            if "default" in kw:
                return dataclasses.field(default=self.literal(where, kw["default"], None), metadata=metadata)
            if "default_factory" in kw:
                made = self.factory(where, kw["default_factory"])
                return dataclasses.field(default_factory=lambda: made() if callable(made) else made,
                                         metadata=metadata)
            return dataclasses.field(metadata=metadata)
        return dataclasses.field(default=self.literal(where, node, None))

    def factory(self, where: str, node: ast.expr):
        if isinstance(node, ast.Name) and node.id in ("list", "dict", "set", "tuple"):
            return {"list": list, "dict": dict, "set": set, "tuple": tuple}[node.id]
        if isinstance(node, ast.Lambda):
            value = self.literal(where, node.body, None)
            return lambda: __import__("copy").deepcopy(value)
        self.notes.append(f"{where}: its default_factory is computed by the script; read as None")
        return None

    def literal(self, where: str, node: ast.expr, fallback):
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError):
            self.notes.append(f"{where}: its default ({ast.unparse(node)}) is computed by the script; read as "
                              f"{fallback!r}")
            return fallback

    def collect_imports(self, path: Path, out: dict[str, bool], seen: Optional[set] = None) -> None:
        """Top-level modules `path` imports anywhere (function bodies too), following modules beside the script;
        an import under try/except counts as optional."""
        seen = seen if seen is not None else set()
        if path in seen:
            return
        seen.add(path)
        for node, optional in _imports(self.tree(path)):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module] if node.level == 0 and node.module else [])
            for module in modules:
                local = self.local_module(module)
                if local is not None:
                    self.collect_imports(local, out, seen)
                elif module.split(".")[0] != "__future__":
                    top = module.split(".")[0]
                    out[top] = out.get(top, True) and optional


def _imports(tree: ast.AST, optional: bool = False):
    """(import node, whether it sits in a try body) over the tree."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, optional
        elif isinstance(child, ast.Try):
            for stmt in child.body:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), True)
            for part in (*child.handlers, *child.orelse, *child.finalbody):
                yield from _imports(part, optional)
        else:
            yield from _imports(child, optional)
