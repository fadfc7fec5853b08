"""docs/core.md is written for adapter authors, who call what it names: every name it cites in backticks as
`module.name`, `Class.name`, `session.name` or `buffer.name` (a call's arguments aside) exists in the package."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import grpo_replay
from grpo_replay import ReplayConfig, ReplaySession

DOC = Path(__file__).resolve().parents[2] / "docs" / "core.md"
PKG = Path(grpo_replay.__file__).parent
CITED = re.compile(r"`([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`")


def _roots() -> dict[str, object]:
    """What a cited name may start with: the package, its top-level modules, the classes it exports, and the two
    objects the page's examples call `session` and `buffer`."""
    roots = {"grpo_replay": grpo_replay}
    roots.update({p.stem: importlib.import_module(f"grpo_replay.{p.stem}") for p in PKG.glob("*.py")
                  if not p.stem.startswith("_")})
    roots.update({n: getattr(grpo_replay, n) for n in grpo_replay.__all__ if isinstance(getattr(grpo_replay, n), type)})
    session = ReplaySession(ReplayConfig(), seed=0)  # the page's `session` and `buffer`, not the modules so named
    return {**roots, "session": session, "buffer": session.buffer}


def _resolves(obj: object, parts: list[str]) -> bool:
    for i, part in enumerate(parts):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:  # a submodule not imported yet (grpo_replay.composition)
            obj = importlib.import_module(f"{obj.__name__}.{part}")  # type: ignore[attr-defined]
        except (AttributeError, ImportError):
            return False
    return True


def cited_names(text: str) -> list[str]:
    return sorted({m.group(1) for m in CITED.finditer(text)})


def missing_names(text: str) -> list[str]:
    roots = _roots()
    return [n for n in cited_names(text) if n.split(".")[0] in roots
            and not _resolves(roots[n.split(".")[0]], n.split(".")[1:])]


def test_every_name_core_md_cites_exists():
    names = cited_names(DOC.read_text())
    assert "rollout.nonfinite_logp_rows" in names and "Tally.merge" in names  # the check reads the page
    assert not missing_names(DOC.read_text()), "docs/core.md cites names the package does not have"


def test_the_check_sees_a_name_that_is_gone():
    text = "use `rollout.without_nonfinite_logps(batch)` and `session.flush(before=step)` and `Tally.reduce`"
    assert missing_names(text) == ["Tally.reduce", "rollout.without_nonfinite_logps"]
