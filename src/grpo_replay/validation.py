"""Field validation shared by every config dataclass (`ReplayConfig`, `LossConfig`, and the app's `TrainConfig`).

Kept apart from the YAML / command-line layer (`configio`) so that the core validates its settings without
importing it.
"""
from __future__ import annotations

import ast
import inspect
import math
import textwrap
from typing import Any, NoReturn

from .errors import ConfigError

# np.random.seed (used by transformers' set_seed under --backend trl) takes 0..2**32-1; runs add small offsets to a
# seed (evaluation, drift probe, the warm start's selection set), so the top of the range is left free.
MAX_SEED = 2**31 - 1


def bad(obj: Any, name: str, allowed: str, label: str | None = None) -> NoReturn:
    """Raise the one error of an invalid field: `Class.field=value is invalid; allowed: ...`; `label` names the
    setting as its user typed it instead of `Class.field` (e.g. a command-line flag)."""
    raise ConfigError(f"{label or f'{type(obj).__name__}.{name}'}={getattr(obj, name)!r} is invalid; allowed: {allowed}")


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_finite(x: Any) -> bool:
    """A real number that is neither NaN nor +-inf (bools and strings are not numbers here)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (CleanRL style), by field name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name):
            if isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant):
                docs[a.target.id] = " ".join(str(b.value.value).split())
    return docs


def field_groups(cls: type) -> dict[str, str]:
    """The heading each field of a dataclass is written under (a `# Parameters ...` comment line in the class body,
    as TRL's configs group their fields), by field name; a field above the first heading has ''."""
    try:
        lines = textwrap.dedent(inspect.getsource(cls)).splitlines()
    except (OSError, TypeError):
        return {}
    headings = [(n, line.strip()[2:]) for n, line in enumerate(lines, 1) if line.startswith("    # Parameters ")]
    groups = {}
    for node in ast.parse("\n".join(lines)).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            groups[node.target.id] = next((h for n, h in reversed(headings) if n < node.lineno), "")
    return groups
