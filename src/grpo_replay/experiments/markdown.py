"""Markdown pieces shared by the reports: a table and a rollout count."""
from __future__ import annotations


def table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub table; a `|` inside a cell is escaped."""
    def cells(r: list[str]) -> str:
        return "| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |"

    return "\n".join([cells(header), "|" + "|".join("---" for _ in header) + "|"] + [cells(r) for r in rows])


def count(x: float) -> str:
    """A rollout count: 38400 -> 38.4k, 96 -> 96."""
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"
