"""Regenerate the README's quick-start figures from one run of the main job, or check them for drift.

    .venv/bin/python scripts/update_docs_figures.py            # run the main job, rewrite README + docs/figures.json
    .venv/bin/python scripts/update_docs_figures.py --check    # run it again, fail if a figure drifted (CI)

The main job is `grpo-replay train` on the embedded testbed with the default config, started from an empty
warm-start cache (so the warm start is part of what is measured). The figures it yields are of two kinds:
- deterministic (accuracies, the warm-start step and pass rate): same seed, same numbers on CPU, so --check
  compares them with docs/figures.json within TOLERANCE_PP percentage points (0.5: float noise across CPU kinds);
- timings (wall-clock seconds): recorded with the machine they were measured on, never checked.
The README block between the `figures:quickstart` markers is generated from docs/figures.json (commit included).
Without --check the script also trains plain GRPO from the same warm start and redraws the README's picture,
`grpo-replay plot <paper run> <grpo run> --out docs/plot/paper_vs_grpo.png` (its table beside it as CSV/JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures.json"
README = ROOT / "README.md"
BEGIN, END = "<!-- figures:quickstart begin (scripts/update_docs_figures.py) -->", "<!-- figures:quickstart end -->"
TOLERANCE_PP = 0.5
COMMAND = "grpo-replay train --no-progress"  # the README's main job (the progress bar off: no terminal here)


PLOT = ROOT / "docs" / "plot" / "paper_vs_grpo.png"


def cli(workdir: Path, *args: str) -> None:
    env = dict(os.environ, GRPO_REPLAY_CACHE=str(workdir / "cache"), HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT / "src"))
    subprocess.run([sys.executable, "-m", "grpo_replay.cli", *args], check=True, env=env, cwd=workdir)


def run_main_job(workdir: Path, extra: list[str]) -> dict:
    out = workdir / "paper-seed0"
    t0 = time.perf_counter()
    cli(workdir, "train", "--no-progress", "--out", str(out), *extra)
    seconds = time.perf_counter() - t0
    summary = json.loads((out / "summary.json").read_text())
    ws = summary["setup"]["warm_start"]
    pct = lambda x: round(100.0 * x, 1)  # noqa: E731
    return {
        "figures": {
            "heldout_acc_sampled_start_pct": pct(summary["heldout_acc_sampled"]["start"]),
            "heldout_acc_sampled_end_pct": pct(summary["heldout_acc_sampled"]["end"]),
            "heldout_acc_greedy_start_pct": pct(summary["heldout_acc_greedy"]["start"]),
            "heldout_acc_greedy_end_pct": pct(summary["heldout_acc_greedy"]["end"]),
            "warm_start_step": ws["step"],
            "warm_start_pass_rate_pct": pct(ws["pass_rate"]),
        },
        "timings": {"main_job_seconds": round(seconds, 1), "warm_start_seconds": round(ws["seconds"], 1)},
    }


def describe_machine() -> str:
    """Cores, architecture, CPU model and Python: the deterministic figures are the same on CPUs of one kind, but
    another CPU model (other vector kernels in torch's BLAS) can move the warm start's stopping step."""
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    except OSError:
        pass
    cpu = f", {model}" if model else ""
    return f"{os.cpu_count()} CPU cores, {platform.machine()}{cpu}, Python {platform.python_version()}"


def commit() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from grpo_replay.app.provenance import git_commit

    return git_commit(ROOT)


def render(rec: dict) -> str:
    f, t = rec["figures"], rec["timings"]
    minutes, seconds = divmod(round(t["main_job_seconds"]), 60)
    return (
        f"{BEGIN}\n"
        f"Measured with `{rec['command']}` from an empty warm-start cache at commit `{rec['commit']}` "
        f"({rec['machine']}): {minutes} min {seconds:02d} s in all, the warm start {t['warm_start_seconds']:.0f} s of "
        f"that (it stopped at step {f['warm_start_step']}, sampled pass rate {f['warm_start_pass_rate_pct']:.1f} %); "
        f"held-out sampled accuracy {f['heldout_acc_sampled_start_pct']:.1f} % -> "
        f"{f['heldout_acc_sampled_end_pct']:.1f} %, greedy {f['heldout_acc_greedy_start_pct']:.1f} % -> "
        f"{f['heldout_acc_greedy_end_pct']:.1f} %. `scripts/update_docs_figures.py` regenerates this paragraph; CI "
        f"reruns it with `--check` (accuracies within {TOLERANCE_PP} pp, timings not checked).\n"
        f"{END}"
    )


def write_readme(rec: dict) -> None:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README}: the figures:quickstart markers are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(head + render(rec) + tail)


def drift(recorded: dict, measured: dict) -> list[str]:
    out = []
    for key, want in recorded["figures"].items():
        got = measured["figures"].get(key)
        tol = 0 if key == "warm_start_step" else TOLERANCE_PP
        if got is None or abs(got - want) > tol:
            out.append(f"{key}: docs say {want}, the code gives {got} (tolerance {tol})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with docs/figures.json instead of writing")
    ap.add_argument("--figures", type=Path, default=FIGURES, help="the recorded figures (default docs/figures.json)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grpo-replay-figures-") as tmp:
        measured = run_main_job(Path(tmp), [])
        if not args.check:  # the README's picture: the main job next to plain GRPO from the same (cached) warm start
            cli(Path(tmp), "train", "--no-progress", "--preset", "grpo", "--out", str(Path(tmp) / "grpo-seed0"))
            cli(Path(tmp), "plot", "paper-seed0", "grpo-seed0", "--out", str(PLOT))
    if args.check:
        recorded = json.loads(args.figures.read_text())
        problems = drift(recorded, measured)
        if README.read_text().count(render(recorded)) != 1:
            problems.append("README's figures paragraph is not the one docs/figures.json renders")
        for p in problems:
            print(f"drift: {p}", file=sys.stderr)
        print(f"measured: {json.dumps(measured)}")
        return 1 if problems else 0
    rec = {"command": COMMAND, "commit": commit(), "machine": describe_machine(), **measured}
    args.figures.write_text(json.dumps(rec, indent=1) + "\n")
    write_readme(rec)
    print(render(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
