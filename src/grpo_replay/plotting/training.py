"""A training run's own PNG plots, drawn into its run directory from its metrics.jsonl and evals.jsonl."""
from __future__ import annotations

from pathlib import Path

from ..app import jsonl
from ..app.run_files import EVALS, METRICS

from . import plt, save


def plot_run(run_dir: Path) -> list[Path]:
    run_dir = Path(run_dir)
    metrics, evals = jsonl.read_metrics(run_dir / METRICS), jsonl.read(run_dir / EVALS)
    out = []

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, label in (("acc_sampled", "sampled mean@n"), ("acc_greedy", "greedy")):
        axes[0].plot([e["step"] for e in evals], [e[key] for e in evals], marker="o", label=label)
        axes[1].plot([e["generated"] for e in evals], [e[key] for e in evals], marker="o", label=label)
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("generated rollouts")
    for ax in axes:
        ax.set_ylabel("held-out accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(run_dir.name)
    out.append(save(fig, run_dir / "accuracy.png"))

    fig, ax = plt.subplots(figsize=(5, 3.8))
    hist = metrics[-1].get("buffer/age_hist", []) if metrics else []
    ax.bar(range(len(hist)), hist)
    ax.set_xlabel("age (steps) at the end of training")
    ax.set_ylabel("stored rollouts")
    ax.set_title("buffer age histogram")
    out.append(save(fig, run_dir / "buffer_age.png"))

    steps = [m["step"] for m in metrics]
    fig, ax = plt.subplots(figsize=(5, 3.8))
    ax.plot(steps, [m["replay/share"] for m in metrics])
    ax.set_xlabel("step")
    ax.set_ylabel("replay share of update rows")
    ax.grid(alpha=0.3)
    out.append(save(fig, run_dir / "replay_share.png"))

    fig, ax = plt.subplots(figsize=(5, 3.8))
    for name in ("fresh", "replay"):
        pts = [(m["step"], m[f"{name}/clip_frac"]) for m in metrics if m.get(f"{name}/count") and f"{name}/clip_frac" in m]
        if pts:
            ax.plot(*zip(*pts), label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("clip fraction (tokens)")
    if ax.get_legend_handles_labels()[0]:  # a run without updates has nothing to plot
        ax.legend()
    ax.grid(alpha=0.3)
    out.append(save(fig, run_dir / "clip_fraction.png"))

    if any("drift/kl_1" in m for m in metrics):  # TrainConfig.drift_probe > 0
        out.append(_drift(run_dir, metrics))
    return out


def _drift(run_dir: Path, metrics: list[dict]) -> Path:
    """drift.png: the per-step policy drift on the probe beside what replay saw (clip fraction, mean ratio)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, label in (("drift/kl_1", "KL(pi_t || pi_t-1)"), ("drift/kl_tau", "KL(pi_t || pi_t-tau_max)")):
        pts = [(m["step"], m[key]) for m in metrics if m.get(key) is not None]
        if pts:
            axes[0].plot(*zip(*pts), label=label)
    axes[0].set_ylabel("mean per-token KL on the probe (nats)")
    for key, label in (("replay/clip_frac", "replay clip fraction"), ("replay/ratio_mean", "|replay ratio mean - 1|")):
        pts = [(m["step"], abs(m[key] - 1) if "ratio" in key else m[key])
               for m in metrics if m.get("replay/count") and m.get(key) is not None]
        if pts:
            axes[1].plot(*zip(*pts), label=label)
    axes[1].set_ylabel("replayed tokens")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(f"{run_dir.name}: policy drift per step and replay's view of it")
    return save(fig, run_dir / "drift.png")

