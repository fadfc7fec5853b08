"""PNG plots of a comparison: accuracy vs generated rollouts with CI bands, the tau_max curve, pass@k curves.

The figures take plain data: an arm's statistics are any object with the fields of `ArmCurves` (the experiments
layer's `ArmStats` is one), so this module imports nothing above it. A CI is a dict with "mean", "lo", "hi" (and
"n"), each None where undefined."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Collection, Protocol, Sequence

import matplotlib.ticker

from . import plt, save


class ArmCurves(Protocol):
    """What the figures read of one arm's statistics."""

    seeds: list[int]
    curve: dict  # "grid": generated rollouts; "acc_sampled" / "acc_greedy": one CI per grid point
    final: dict  # metric -> CI at the end of training
    pass_at_k: dict  # k -> CI; "diff" -> {k -> paired CI vs the base arm}


def _clip(v: float) -> float:
    """Accuracy bands are drawn inside [0, 100] % (the t-interval itself is reported unclipped)."""
    return min(100.0, max(0.0, v))


def _series(cis: list[dict], grid: list[float]):
    xs, m, lo, hi = [], [], [], []
    for x, c in zip(grid, cis):
        if c["mean"] is None:
            continue
        xs.append(x)
        m.append(100 * c["mean"])
        lo.append(_clip(100 * (c["lo"] if c["lo"] is not None else c["mean"])))
        hi.append(_clip(100 * (c["hi"] if c["hi"] is not None else c["mean"])))
    return xs, m, lo, hi


def accuracy_curves(stats: dict[str, ArmCurves], arms: list[str], labels: dict[str, str], title: str, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharex=True)
    for ax, key, name in ((axes[0], "acc_sampled", "sampled mean@n"), (axes[1], "acc_greedy", "greedy")):
        for arm in arms:
            st = stats[arm]
            xs, m, lo, hi = _series(st.curve[key], st.curve["grid"])
            style = "--" if arm.startswith("grpo") else "-"
            (line,) = ax.plot(xs, m, style, marker=".", label=labels.get(arm, arm))
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set_xlabel("generated rollouts")
        ax.set_ylabel(f"held-out accuracy, {name} (%)")
        ax.grid(alpha=0.3)
    n = max((len(stats[a].seeds) for a in arms), default=0)
    fig.suptitle(f"{title}: mean over {n} seeds, band = 95 % CI")
    axes[0].legend(fontsize=7, loc="best")
    return save(fig, path)


def tau_curve(stats: dict[str, ArmCurves], tau_arms: dict[str, float], path: Path, base: str = "grpo") -> Path:
    """Final sampled and greedy accuracy vs tau_max (no eviction drawn at the right end), GRPO as a band."""
    items = sorted(((t, a) for a, t in tau_arms.items() if a in stats), key=lambda x: x[0])
    finite = [t for t, _ in items if math.isfinite(t)]
    x_none = (max(finite) * 2.5) if finite else 1.0
    xs = [t if math.isfinite(t) else x_none for t, _ in items]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for key, name, marker in (("acc_sampled", "sampled mean@n", "o"), ("acc_greedy", "greedy", "s")):
        ms = [100 * stats[a].final[key]["mean"] for _, a in items]
        fin = [stats[a].final[key] for _, a in items]
        err = [
            [m - _clip(100 * (f["lo"] if f["lo"] is not None else f["mean"])) for m, f in zip(ms, fin)],
            [_clip(100 * (f["hi"] if f["hi"] is not None else f["mean"])) - m for m, f in zip(ms, fin)],
        ]
        (line,) = ax.plot(xs, ms, marker=marker, label=f"replay, {name}")
        ax.errorbar(xs, ms, yerr=err, fmt="none", ecolor=line.get_color(), capsize=3)
        if base in stats:
            b = stats[base].final[key]
            ax.axhline(100 * b["mean"], color=line.get_color(), ls="--", lw=1, label=f"GRPO, {name}")
            if b["lo"] is not None:
                ax.axhspan(_clip(100 * b["lo"]), _clip(100 * b["hi"]), color=line.get_color(), alpha=0.08)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks(xs)
    ax.set_xticklabels(["none" if not math.isfinite(t) else f"{t:g}" for t, _ in items])
    ax.set_xlabel("tau_max (steps)")
    ax.set_ylabel("final held-out accuracy (%)")
    ax.set_title("Age eviction: final accuracy vs tau_max (95 % CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def paired_diff_curves(views: dict[str, dict], arms: list[str], labels: dict[str, str], title: str, path: Path) -> Path:
    """Each arm's paired difference to GRPO (same seed) in sampled accuracy vs generated rollouts, band = 95 % CI of
    the per-seed differences (not clipped: a difference may be negative)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    n = 0
    for arm in arms:
        v = views[arm]
        pts = [(x, c) for x, c in zip(v["grid"], v["paired_curve"]) if c["mean"] is not None]
        if not pts:
            continue
        n = max(n, max(c["n"] for _, c in pts))
        xs = [x for x, _ in pts]
        (line,) = ax.plot(xs, [100 * c["mean"] for _, c in pts], marker=".", label=labels.get(arm, arm))
        lo = [100 * (c["lo"] if c["lo"] is not None else c["mean"]) for _, c in pts]
        hi = [100 * (c["hi"] if c["hi"] is not None else c["mean"]) for _, c in pts]
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.12, linewidth=0)
    ax.axhline(0.0, color="black", lw=1, ls="--")
    ax.set_xlabel("generated rollouts")
    ax.set_ylabel("held-out sampled accuracy minus GRPO's (pp)")
    ax.set_title(f"{title}\npaired difference to GRPO (same seed), up to {n} seeds, band = 95 % CI", fontsize=9)
    ax.grid(alpha=0.3)
    if n:
        ax.legend(fontsize=7, loc="best")
    return save(fig, path)


def pass_at_k_curves(stats: dict[str, ArmCurves], arms: list[str], labels: dict[str, str], title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, arm in enumerate(arms):
        pk = {k: v for k, v in stats[arm].pass_at_k.items() if k != "diff"}
        ks = sorted(pk)
        ms = [100 * pk[k]["mean"] for k in ks]
        lo = [_clip(100 * (pk[k]["lo"] if pk[k]["lo"] is not None else pk[k]["mean"])) for k in ks]
        hi = [_clip(100 * (pk[k]["hi"] if pk[k]["hi"] is not None else pk[k]["mean"])) for k in ks]
        style = "--" if arm.startswith("grpo") else "-"
        (line,) = ax.plot(ks, ms, style, marker="o", label=labels.get(arm, arm))
        ax.fill_between(ks, lo, hi, color=line.get_color(), alpha=0.12, linewidth=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks_all := sorted({k for a in arms for k in stats[a].pass_at_k if k != "diff"}))
    ax.set_xticklabels([str(k) for k in ks_all])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("k")
    ax.set_ylabel("final held-out pass@k (%)")
    ax.set_title(f"{title}: pass@k (95 % CI)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def gain_vs_size(rows: list[dict], trend: dict, arm: str, path: Path) -> Path:
    """The model-size series: each seed's paired gain over GRPO by model size, the mean with its 95 % CI and
    the least-squares trend."""

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for r in rows:
        for s, g in r["gain_per_seed"].items():
            ax.plot(r["n_params"], 100 * g, ".", color="0.6")
        c = r["gain"]
        if c["mean"] is not None:
            err = [[100 * (c["mean"] - c["lo"])], [100 * (c["hi"] - c["mean"])]] if c["lo"] is not None else None
            ax.errorbar(r["n_params"], 100 * c["mean"], yerr=err, fmt="o", color="C0", capsize=4)
    if trend.get("mean") is not None and trend.get("intercept") is not None:
        ps = [r["n_params"] for r in rows]
        xs = [min(ps), max(ps)]
        ax.plot(xs, [100 * (trend["intercept"] + trend["mean"] * math.log(x, 4)) for x in xs], "--", color="C1",
                label=f"least squares: {100 * trend['mean']:+.2f} pp per 4x parameters")
        ax.legend(fontsize=8)
    ax.axhline(0, color="k", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel(f"final sampled accuracy, {arm} - GRPO (pp)")
    ax.set_title("Gain over GRPO by model size: per seed (grey), mean with 95 % CI")
    ax.grid(alpha=0.3)
    return save(fig, path)


def axes_curves(sec: dict, names: list[str], labels: dict[str, str], title: str, path: Path,
                axes_named: Sequence[tuple[str, str]], dashed: Collection[str]) -> Path:
    """The alternatives section's figure: mean held-out sampled accuracy with 95 % bands against each of
    `axes_named` ((key in sec["curves"][arm], axis label), e.g. generated rollouts, update row-passes, training
    time); the arms in `dashed` (those without replay) drawn dashed."""
    fig, axes = plt.subplots(1, len(axes_named), figsize=(16, 4.2), sharey=True)
    for ax, (key, name) in zip(axes, axes_named):
        for a in names:
            c = sec["curves"].get(a, {}).get(key)
            if not c:
                continue
            pts = [(x, p) for x, p in zip(c["grid"], c["ci"]) if p["mean"] is not None]
            xs = [x for x, _ in pts]
            m = [100 * p["mean"] for _, p in pts]
            lo = [100 * (p["lo"] if p.get("lo") is not None else p["mean"]) for _, p in pts]
            hi = [100 * (p["hi"] if p.get("hi") is not None else p["mean"]) for _, p in pts]
            (line,) = ax.plot(xs, m, "--" if a in dashed else "-", marker=".", label=labels.get(a, a))
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set_xlabel(name)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out accuracy, sampled mean@n (%)")
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle(f"{title}: mean over seeds, band = 95 % CI")
    return save(fig, path)
