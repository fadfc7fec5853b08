"""The GPU check's results and its two reports (JSON for tools, Markdown for a person), written as checks finish."""
from __future__ import annotations

import json
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

STATUSES = ("passed", "failed", "skipped")
JSON_NAME, MD_NAME = "gpu_check.json", "gpu_check.md"


@dataclass
class Result:
    """One check: `status` one of STATUSES; `why` says what failed or why it was skipped (empty when it passed);
    `figures` the measured numbers; `rows` optional table rows (each a dict with the same keys) for the Markdown."""

    name: str
    title: str
    status: str = "passed"
    why: str = ""
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run_check(name: str, title: str, fn: Callable[[Result], None], out: Optional[Path] = None) -> Result:
    """Run `fn(result)`, timing it; an exception is a failure whose message (type and text) becomes `why`, its
    traceback written to OUT/NAME-traceback.txt when `out` is given."""
    res = Result(name, title)
    t0 = time.perf_counter()
    try:
        fn(res)
    except Exception as e:  # a check's failure is reported, the next check still runs
        res.status, res.why = "failed", f"{type(e).__name__}: {str(e).strip()[:2000]}"
        if out is not None:
            path = out / f"{name}-traceback.txt"
            path.write_text(traceback.format_exc())
            res.why += f" (traceback: {path})"
    res.seconds = round(time.perf_counter() - t0, 2)
    return res


def skipped(name: str, title: str, why: str) -> Result:
    return Result(name, title, status="skipped", why=why)


def write(out: Path, header: dict[str, Any], results: list[Result]) -> tuple[Path, Path]:
    """Write OUT/gpu_check.json and OUT/gpu_check.md; returns their paths."""
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    doc = {**header, "summary": counts, "checks": [asdict(r) for r in results]}
    (out / JSON_NAME).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / MD_NAME).write_text(markdown(header, counts, results))
    return out / JSON_NAME, out / MD_NAME


def markdown(header: dict[str, Any], counts: dict[str, int], results: list[Result]) -> str:
    lines = ["# GPU check", "", f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
             f"({header.get('device_name', header.get('device'))}; torch {header.get('torch')}; "
             f"{header.get('started')}).", ""]
    lines += [f"- {k}: {v}" for k, v in header.items() if k not in ("started",)]
    lines += ["", "| check | status | seconds | what | why (failed or skipped) |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.name} | **{r.status}** | {r.seconds:.1f} | {r.title} | {_cell(r.why) or '-'} |")
    for r in results:
        if not (r.figures or r.rows or r.notes):
            continue
        lines += ["", f"## {r.name}: {r.title}", ""]
        lines += [f"- {k}: {_fmt(v)}" for k, v in r.figures.items()]
        if r.rows:
            keys = list(r.rows[0])
            lines += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(_cell(_fmt(row.get(k))) for k in keys) + " |" for row in r.rows]
        if r.notes:
            lines += [""] + [f"- {n}" for n in r.notes]
    return "\n".join(lines) + "\n"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def _cell(text: Optional[str]) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")
