"""docs/paper_table.md's cost table is its stated formula: every cell recomputed from it, rounded as printed."""
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "paper_table.md"
SIZES = {"Qwen3-0.6B-Base": 0.6, "Qwen3-1.7B-Base": 1.7, "Qwen3-4B-Base": 4.0}


def formula(n: float) -> list[float]:
    r = 1562 * 8 / n
    run = 300 * 1024 * 1060 / r / 3600
    ev = 623 * 16 * 2000 / r / 3600
    arm = lambda f: 3 * (run * f + ev)  # noqa: E731
    return [run, run * 1.16, ev, arm(1.0), arm(1.16), 3 * arm(1.0) + arm(1.16)]


def test_every_cell_of_the_cost_table_is_the_formula():
    section = DOC.read_text().split("### Cost estimate")[1]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| (Qwen3-[\w.]+-Base) \|(.*)\|$", section, re.M)}
    assert set(rows) == set(SIZES)
    for model, cells in rows.items():
        printed = [float(x) for x in re.findall(r"[\d.]+", cells)]
        want = formula(SIZES[model])
        decimals = [1, 1, 1, 1, 1, 0]
        assert printed == [round(w, d) for w, d in zip(want, decimals)], (model, printed, want)
