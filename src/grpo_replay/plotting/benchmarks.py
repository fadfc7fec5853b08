"""An evaluation's PNG plots: pass@k against k per benchmark, and completion length split by correctness."""
from __future__ import annotations

from pathlib import Path

from . import plt, save


def plot_pass_at_k(rows: list[tuple[str, dict]], model: str, path: Path) -> None:
    """pass@k against k (log2 axis), one line per (benchmark name, results row), the mean row named **mean**."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, row in rows:
        ks = sorted(int(k) for k in row["pass@k"])
        ys = [100 * (row["pass@k"][str(k)] or 0.0) for k in ks]
        style = dict(color="black", linewidth=2.5) if name == "**mean**" else {}
        ax.plot(ks, ys, marker="o", label=name.strip("*"), **style)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (%)")
    ax.set_title(f"pass@k: {Path(str(model)).name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path, dpi=120)


def plot_length_split(rows: list[tuple[str, dict]], path: Path) -> None:
    """Grouped bars: mean tokens of correct vs incorrect completions per benchmark."""
    names = [name.strip("*") for name, _ in rows]
    rows = [row for _, row in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4))
    width = 0.38
    for offset, part, color in ((-width / 2, "correct", "tab:green"), (width / 2, "incorrect", "tab:red")):
        ax.bar([x + offset for x in xs], [r["length"][part] or 0.0 for r in rows], width, label=part, color=color)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=20)
    ax.set_ylabel("mean completion length (tokens)")
    ax.set_title("completion length by correctness")
    ax.legend()
    save(fig, path, dpi=120)
