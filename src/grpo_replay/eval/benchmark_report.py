"""Writing results: JSON (every number), a markdown table and PNG plots (pass@k curves, length split)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from ..errors import InputNotFound, UsageError
from .harness import MEAN_KEY

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
PASS_AT_K_PNG = "pass_at_k.png"
LENGTH_PNG = "length_split.png"


def _fmt(x: Optional[float], pct: bool = False, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if pct:
        return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}"
    return f"{x:+.3f}" if signed else f"{x:.1f}"


def _rows(results: dict):
    yield from results["benchmarks"].items()
    yield "**mean**", results[MEAN_KEY]


def markdown_table(results: dict) -> str:
    """A markdown summary: accuracy (mean@n, pass@k, in %), lengths, and the baseline comparison if any."""
    n = results["settings"]["sampling"]["n"]
    ks = [str(k) for k in results["settings"]["ks"]]
    has_base = "baseline" in results
    head = ["benchmark", "problems", f"mean@{n}"] + [f"pass@{k}" for k in ks]
    head += ["len all", "len correct", "len incorrect"]
    if has_base:
        head += ["AES", "Δlen all", "Δlen correct", "Δlen incorrect"]
    lines = [
        f"# Evaluation: `{results['model']}`",
        "",
        f"backend {results['backend']}, n={n}, temperature {results['settings']['sampling']['temperature']}, "
        f"top-p {results['settings']['sampling']['top_p']}, max new tokens "
        f"{results['settings']['sampling']['max_new_tokens']}; accuracy in %, lengths in tokens.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for name, row in _rows(results):
        probs = str(row.get("num_problems", "")) if name != "**mean**" else ""
        cells = [name, probs, _fmt(row["mean@n"], pct=True)] + [_fmt(row["pass@k"].get(k), pct=True) for k in ks]
        cells += [_fmt(row["length"][p]) for p in ("all", "correct", "incorrect")]
        if has_base:
            vs = row.get("vs_baseline") or {}
            change = vs.get("length_change", {})
            cells += [_fmt(vs.get("aes"), signed=True)]
            cells += [_fmt(change.get(p), pct=True, signed=True) for p in ("all", "correct", "incorrect")]
        lines.append("| " + " | ".join(cells) + " |")
    if has_base:
        lines += ["", f"Baseline: `{results['baseline'].get('model')}`. AES weights: {results['settings']['aes_weights']}."]
    return "\n".join(lines) + "\n"


def write_report(results: dict, out_dir: Path) -> dict[str, Path]:
    """Write results.json, results.md, pass_at_k.png and length_split.png into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / RESULTS_JSON,
        "markdown": out_dir / RESULTS_MD,
        "pass_at_k": out_dir / PASS_AT_K_PNG,
        "length_split": out_dir / LENGTH_PNG,
    }
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    tmp.replace(paths["json"])  # atomic: a crash never leaves a half-written results file
    paths["markdown"].write_text(markdown_table(results), encoding="utf-8")
    from ..plotting.benchmarks import plot_length_split, plot_pass_at_k

    rows = list(_rows(results))
    plot_pass_at_k(rows, results["model"], paths["pass_at_k"])
    plot_length_split(rows, paths["length_split"])
    return paths


def load_results(path) -> dict:
    """Read a results.json (e.g. the ``--baseline``), checking it has the fields the comparison needs."""
    path = Path(path)
    if not path.is_file():
        raise InputNotFound(f"baseline results {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UsageError(f"baseline results {path}: invalid JSON ({exc})") from exc
    if not isinstance(data, dict) or "benchmarks" not in data or MEAN_KEY not in data:
        raise UsageError(f"baseline results {path}: expected a results.json from `grpo-replay eval`")
    return data
