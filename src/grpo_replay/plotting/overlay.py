"""The figure and table of `grpo-replay plot` (cli/plot.py): several training runs on shared axes, plus a table of final
metrics.

Panels: held-out accuracy vs generated rollouts, reward vs generated rollouts, replay share vs step, clip fraction
of fresh (solid) and replayed (dashed) tokens vs step. Each run is labelled by its preset and seed (from its
config.yaml), and runs that share those by the settings that tell them apart. The table is printed and written beside the PNG as <out>.csv and <out>.json. A run that has not
finished (no summary.json, e.g. still training or killed) is plotted up to its last logged step and marked so.
"""
from __future__ import annotations

import csv
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from ..app import jsonl
from ..app.run_files import CONFIG, EVALS, METRICS, SUMMARY
from ..errors import UsageError

TABLE_COLUMNS = (
    "label", "status", "steps", "generated", "acc_sampled_start", "acc_sampled", "acc_greedy",
    "reward_last10", "replay_share_mean", "fresh_clip_frac_mean", "replay_clip_frac_mean", "run_dir",
)


class NotARunError(UsageError):
    """A directory that is not a grpo-replay run directory (or has nothing to plot yet)."""


def load_run(run_dir: Path) -> dict[str, Any]:
    import yaml

    if not run_dir.is_dir():
        raise NotARunError(f"{run_dir} is not a directory")
    cfg_path = run_dir / CONFIG
    if not cfg_path.is_file():
        raise NotARunError(
            f"{run_dir} is not a grpo-replay run directory (no {CONFIG}; a run directory is what "
            f"`grpo-replay train --out DIR` writes, e.g. runs/paper-seed0)"
        )
    try:
        cfg = yaml.safe_load(cfg_path.read_text()) or {}
    except yaml.YAMLError as e:
        raise NotARunError(f"{cfg_path} is not valid YAML: {e}") from None
    if not isinstance(cfg, dict):
        raise NotARunError(f"{cfg_path} does not hold a config mapping")
    metrics, evals = jsonl.read_metrics(run_dir / METRICS), jsonl.read(run_dir / EVALS)
    if not metrics and not evals:
        raise NotARunError(f"{run_dir} has no logged steps yet ({METRICS} and {EVALS} are empty or missing)")
    summary = None
    if (run_dir / SUMMARY).is_file():
        try:
            summary = json.loads((run_dir / SUMMARY).read_text())
        except json.JSONDecodeError:
            summary = None
    return {
        "run_dir": run_dir,
        "config": _flat(cfg),
        "preset": cfg.get("preset", "?"),
        "seed": cfg.get("seed", "?"),
        "steps": cfg.get("steps"),
        "metrics": metrics,
        "evals": evals,
        "finished": summary is not None,
        "steps_done": max([r["step"] for r in metrics] or [0]),
    }


# Where a run's files go and what it prints: never what tells two runs apart.
_NOT_A_DIFFERENCE = ("out_dir", "progress", "testbed.cache_dir", "testbed.progress_every", "report_to")


def _flat(cfg: dict, prefix: str = "") -> dict[str, Any]:
    """config.yaml's nested keys dotted (`replay.tau_max`)."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def label_runs(runs: list[dict]) -> None:
    """'<preset> seed <seed>'; runs that share it get the settings that differ among them (a run's value is left
    out where most of them have it: `paper seed 0 (update_epochs=3)`), and runs still alike the distinguishing part
    of their path (compare's arms)."""
    base = [f"{r['preset']} seed {r['seed']}" for r in runs]
    paths = [str(r["run_dir"].resolve()) for r in runs]
    common = os.path.commonpath(paths) if len(paths) > 1 else str(Path(paths[0]).parent)
    tags = [""] * len(runs)
    for b in set(base):
        group = [i for i, x in enumerate(base) if x == b]
        if len(group) > 1:
            for i, t in zip(group, _differences([runs[i]["config"] for i in group])):
                tags[i] = t
    alike = Counter(zip(base, tags))
    for r, b, p, t in zip(runs, base, paths, tags):
        if alike[b, t] > 1:
            rel = os.path.relpath(p, common)  # "." for the run whose directory holds the others: its own path then
            t = ", ".join(filter(None, [t, rel if rel != "." else str(r["run_dir"])]))
        r["label"] = b + (f" ({t})" if t else "") + ("" if r["finished"] else f" [unfinished: step {r['steps_done']}/{r['steps']}]")


def _differences(configs: list[dict]) -> list[str]:
    """Per config, `key=value` of each key whose value differs among them, unless it is the one value most of them
    hold."""
    tags: list[list[str]] = [[] for _ in configs]
    for k in sorted({k for c in configs for k in c} - set(_NOT_A_DIFFERENCE)):
        values = [json.dumps(c.get(k), sort_keys=True) for c in configs]
        counts = Counter(values).most_common()
        if len(counts) == 1:
            continue
        usual = counts[0][0] if counts[0][1] > counts[1][1] else None
        for t, c, v in zip(tags, configs, values):
            if v != usual:
                t.append(f"{k}={c.get(k) if isinstance(c.get(k), str) else v}")
    return [", ".join(t) for t in tags]


def _mean(xs: list) -> Optional[float]:
    xs = [float(x) for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def final_metrics(r: dict) -> dict[str, Any]:
    m, e = r["metrics"], r["evals"]
    last_eval = e[-1] if e else {}
    return {
        "label": r["label"],
        "status": "finished" if r["finished"] else "unfinished",
        "steps": f"{r['steps_done']}/{r['steps']}",
        "generated": m[-1].get("generated") if m else 0,
        "acc_sampled_start": e[0].get("acc_sampled") if e else None,
        "acc_sampled": last_eval.get("acc_sampled"),
        "acc_greedy": last_eval.get("acc_greedy"),
        "reward_last10": _mean([x.get("reward") for x in m[-10:]]),
        "replay_share_mean": _mean([x.get("replay/share") for x in m]),
        "fresh_clip_frac_mean": _mean([x.get("fresh/clip_frac") for x in m if x.get("fresh/count")]),
        "replay_clip_frac_mean": _mean([x.get("replay/clip_frac") for x in m if x.get("replay/count")]),
        "run_dir": str(r["run_dir"]),
    }


def plot_runs(runs: list[dict], out: Path) -> Path:
    from . import plt, save  # here, not at the top: `grpo-replay plot --help` stays fast

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (acc, rew), (share, clip) = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(runs):
        c, m, e = colors[i % len(colors)], r["metrics"], r["evals"]
        pts = [(x["generated"], x["acc_sampled"]) for x in e if "generated" in x and "acc_sampled" in x]
        if pts:
            acc.plot(*zip(*pts), marker="o", color=c, label=r["label"])
        pts = [(x["generated"], x["reward"]) for x in m if "generated" in x and isinstance(x.get("reward"), (int, float))]
        if pts:
            rew.plot(*zip(*pts), color=c, label=r["label"])
        pts = [(x["step"], x["replay/share"]) for x in m if isinstance(x.get("replay/share"), (int, float))]
        if pts:
            share.plot(*zip(*pts), color=c, label=r["label"])
        for kind, style in (("fresh", "-"), ("replay", "--")):
            pts = [(x["step"], x[f"{kind}/clip_frac"]) for x in m if x.get(f"{kind}/count") and f"{kind}/clip_frac" in x]
            if pts:
                clip.plot(*zip(*pts), linestyle=style, color=c, label=f"{r['label']}: {kind}")
    for ax, xl, yl in (
        (acc, "generated rollouts", "held-out accuracy (sampled mean@n)"),
        (rew, "generated rollouts", "mean training reward"),
        (share, "step", "replay share of update rows"),
        (clip, "step", "clip fraction (solid fresh, dashed replay)"),
    ):
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return save(fig, out)


def write_table(table: list[dict], out: Path) -> None:
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=TABLE_COLUMNS)
        w.writeheader()
        w.writerows(table)
    out.with_suffix(".json").write_text(json.dumps(table, indent=1))


def format_table(table: list[dict]) -> str:
    cols = [c for c in TABLE_COLUMNS if c != "run_dir"]

    def cell(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    cells = [[cell(row[c]) for c in cols] for row in table]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)
