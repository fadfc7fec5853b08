"""Rebuild docs/results/smollm2 from the run directories of run.sh: curves, tables, per-arm logs.

    python docs/results/smollm2/report.py runs/smollm2 docs/results/smollm2
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from grpo_replay.app import jsonl  # noqa: E402

ARMS = {"paper": "paper preset (replay)", "grpo": "GRPO (no replay)"}
KEEP = ("config.yaml", "metrics.jsonl", "evals.jsonl", "summary.json")


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def main(runs: Path, out: Path) -> None:
    data = {}
    for arm in ARMS:
        d = runs / f"{arm}-seed0"
        if (d / "metrics.jsonl").exists():
            data[arm] = (jsonl.read_metrics(d / "metrics.jsonl"), jsonl.read(d / "evals.jsonl"))
            (out / arm).mkdir(parents=True, exist_ok=True)
            for name in KEEP:
                if (d / name).exists():
                    shutil.copy(d / name, out / arm / name)
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    for arm, (m, e) in data.items():
        steps = [r["step"] for r in m]
        ax[0, 0].plot(steps, [r["reward"] for r in m], marker=".", label=ARMS[arm])
        ax[0, 1].plot([r["step"] for r in e], [r["acc_sampled"] for r in e], marker="o", label=f"{ARMS[arm]}, sampled")
        ax[0, 1].plot([r["step"] for r in e], [r["acc_greedy"] for r in e], marker="x", ls="--", label=f"{ARMS[arm]}, greedy")
        ax[1, 0].plot(steps, [r.get("replay/share", 0) for r in m], marker=".", label=f"{ARMS[arm]}, replay share")
        ax[1, 0].plot(steps, [r.get("replay/age_mean", 0) for r in m], ls=":", label=f"{ARMS[arm]}, replay age mean")
        ax[1, 1].plot(steps, [r["time/step_s"] for r in m], marker=".", label=ARMS[arm])
    for a, title in zip(ax.flat, ("training reward (mean over the step's rollouts)", "held-out accuracy",
                                   "replay share of update rows / mean replay age (steps)", "wall time per step (s)")):
        a.set_title(title, fontsize=10)
        a.set_xlabel("step")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)

    lines = ["| arm | steps done | mean reward | held-out sampled (start -> last) | greedy (start -> last) | "
             "replay rows | mean replay age | zero-variance groups | mean s/step (generate) |", "|---|---|---|---|---|---|---|---|---|"]
    for arm, (m, e) in data.items():
        rep = sum(r.get("replay/count", 0) for r in m)
        lines.append(
            f"| {ARMS[arm]} | {len(m)} | {mean([r['reward'] for r in m]):.3f} | "
            f"{e[0]['acc_sampled']:.3f} -> {e[-1]['acc_sampled']:.3f} (step {e[-1]['step']}) | "
            f"{e[0]['acc_greedy']:.3f} -> {e[-1]['acc_greedy']:.3f} | {rep} | "
            f"{mean([r.get('replay/age_mean') for r in m if r.get('replay/count')]):.2f} | "
            f"{mean([r['frac_zero_var_groups'] for r in m]):.2f} | "
            f"{mean([r['time/step_s'] for r in m]):.0f} ({mean([r['time/generate_s'] for r in m]):.0f}) |"
        )
    lines += ["", "Held-out evaluations (sampled mean@n / greedy, per operand digit count):", "",
              "| arm | step | sampled | greedy | by digits (sampled) | len correct / incorrect |", "|---|---|---|---|---|---|"]
    for arm, (m, e) in data.items():
        for r in e:
            by = ", ".join(f"{k}: {v:.2f}" for k, v in r.get("acc_by_difficulty", {}).items())
            lc = "-" if r.get("len_correct") is None else f"{r['len_correct']:.1f}"
            li = "-" if r.get("len_incorrect") is None else f"{r['len_incorrect']:.1f}"
            lines.append(f"| {ARMS[arm]} | {r['step']} | {r['acc_sampled']:.3f} | {r['acc_greedy']:.3f} | {by} | {lc} / {li} |")
    (out / "tables.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
