"""Regenerate the README's quick-start figures from one run of the main job, or check them (CI).

    .venv/bin/python scripts/update_docs_figures.py            # run the main job, record this CPU kind's figures
    .venv/bin/python scripts/update_docs_figures.py --check    # run it again, fail if the job regressed
    .venv/bin/python scripts/update_docs_figures.py --check --run runs/paper-seed0   # check the run the README's
                                                               # main job just made (CI: no second run)

The main job is `grpo-replay train` on the embedded testbed with the default config, started from an empty
warm-start cache (so the warm start is part of what is measured). One seed gives identical numbers on one CPU kind
(model name and the vector kernels torch dispatches to, with the same torch) and other numbers on another kind: the
kernels round differently, and the warm start's stopping rule and the sampling amplify that. So docs/figures.json
records the figures per kind, and --check
- on a recorded kind, compares every figure exactly (accuracies to the 0.1 pp they are recorded in, the warm-start
  step and pass rate);
- on any other kind, checks what must hold on every machine (`invariants`): the warm start stopped inside its
  target window, held-out sampled accuracy rose by at least MIN_RISE_PP, greedy accuracy did not fall, and the
  paper's method replayed rows. It then prints this kind's figures, to be added with a plain run of this script.
Timings are recorded with the machine, never checked. Without --check the script records (or replaces) this kind's
entry and rewrites the README paragraph between the `figures:quickstart` markers (it shows the README's kind,
`readme_kind`, and names the others); on the README's kind (or with --readme) it also redraws the README's
picture, `grpo-replay plot <paper run> <grpo run>` (plain GRPO trained from the same warm start; its table beside it
as CSV/JSON). `--set KEY=VALUE` passes a setting to the main
job: only to show that --check fails when training is broken (e.g. `--set lr=1e-12`).
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
sys.path.insert(0, str(ROOT / "src"))
from grpo_replay.app.provenance import cpu_capability, cpu_kind, cpu_model, git_commit  # noqa: E402
from grpo_replay.app.jsonl import read_metrics  # noqa: E402
from grpo_replay.app.run_files import METRICS, SUMMARY  # noqa: E402

FIGURES = ROOT / "docs" / "figures.json"
README = ROOT / "README.md"
PLOT = ROOT / "docs" / "plot" / "paper_vs_grpo.png"
BEGIN, END = "<!-- figures:quickstart begin (scripts/update_docs_figures.py) -->", "<!-- figures:quickstart end -->"
COMMAND = "grpo-replay train --no-progress"  # the README's main job (the progress bar off: no terminal here)
# The smallest sampled-accuracy rise any kind may show. Measured rises of the main job over four CPU kinds and kernel
# paths (docs/testbed.md, "One seed, several CPU kinds") lie between 10.7 and 14.8 pp; a run whose policy does not
# learn (lr 1e-12) rose by 0.0 pp (every evaluation samples with one seed, so an unchanged policy scores the same).
# 5 pp is under half the smallest rise seen.
MIN_RISE_PP = 5.0


def cli(workdir: Path, *args: str) -> None:
    env = dict(os.environ, GRPO_REPLAY_CACHE=str(workdir / "cache"), HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT / "src"))
    subprocess.run([sys.executable, "-m", "grpo_replay.cli", *args], check=True, env=env, cwd=workdir)


def run_main_job(workdir: Path, extra: list[str]) -> tuple[dict, dict]:
    """(the figures and timings of one main-job run, what `invariants` reads from the run directory)."""
    out = workdir / "paper-seed0"
    t0 = time.perf_counter()
    cli(workdir, "train", "--no-progress", "--out", str(out), *extra)
    return read_run(out, time.perf_counter() - t0)


def finished_main_job(out: Path) -> list[str]:
    """Why `out` is not a finished run of the main job made by this checkout's code from an empty warm-start cache
    (what --check measures); empty when it is."""
    from grpo_replay.app.run_files import CONFIG
    from grpo_replay.trainer.train_config import resolve

    if not (out / SUMMARY).is_file():
        return [f"{out} holds no {SUMMARY}: not a finished run (run the README's main job first)"]
    summary = json.loads((out / SUMMARY).read_text())
    problems = []
    made, here = summary.get("provenance", {}).get("commit"), git_commit(ROOT)
    if made != here:
        problems.append(f"{out} was made by commit {made}, this checkout is {here}")
    if summary["setup"]["warm_start"].get("from_cache"):
        problems.append(f"{out}'s warm start came from a cache (GRPO_REPLAY_CACHE): the check measures one from empty")
    ignore = ("out_dir", "progress")
    ran, default = resolve(yaml_path=str(out / CONFIG)).flat(), resolve({}).flat()
    changed = sorted(k for k in set(ran) | set(default) if k not in ignore and ran.get(k) != default.get(k))
    if changed:
        problems.append(f"{out} is not the main job's default config: {', '.join(changed)} differ")
    return problems


def read_run(out: Path, seconds: float | None) -> tuple[dict, dict]:
    """(figures and timings, facts) of the finished main-job run in `out`; seconds None: not timed here."""
    summary = json.loads((out / SUMMARY).read_text())
    metrics = read_metrics(out / METRICS)
    ws = summary["setup"]["warm_start"]
    pct = lambda x: round(100.0 * x, 1)  # noqa: E731
    measured = {
        "figures": {
            "heldout_acc_sampled_start_pct": pct(summary["heldout_acc_sampled"]["start"]),
            "heldout_acc_sampled_end_pct": pct(summary["heldout_acc_sampled"]["end"]),
            "heldout_acc_greedy_start_pct": pct(summary["heldout_acc_greedy"]["start"]),
            "heldout_acc_greedy_end_pct": pct(summary["heldout_acc_greedy"]["end"]),
            "warm_start_step": ws["step"],
            "warm_start_pass_rate_pct": pct(ws["pass_rate"]),
        },
        "timings": {"main_job_seconds": None if seconds is None else round(seconds, 1),
                    "warm_start_seconds": round(ws["seconds"], 1)},
    }
    window = ws["config"]["target_pass_low"], ws["config"]["target_pass_high"]
    facts = {"warm_start_stop_reason": ws["stop_reason"], "warm_start_window_pct": [pct(w) for w in window],
             "replayed_rows": sum(int(m.get("replay/count") or 0) for m in metrics)}
    return measured, facts


def this_kind() -> dict[str, str]:
    """The CPU kind of this machine (and of the job this script starts: it inherits the environment)."""
    import torch

    return {"cpu": cpu_model(), "cpu_capability": cpu_capability(), "torch": torch.__version__}


def kind_key(kind: dict[str, str]) -> str:
    return f"{cpu_kind(kind)}, torch {kind['torch']}"


def describe_machine(kind: dict[str, str]) -> str:
    return f"{os.cpu_count()} CPU cores, {platform.machine()}, {cpu_kind(kind)}, Python {platform.python_version()}"


def drift(recorded: dict, measured: dict) -> list[str]:
    """Every figure of a recorded kind that the code no longer gives exactly."""
    out = []
    for key, want in recorded["figures"].items():
        got = measured["figures"].get(key)
        if got != want:
            out.append(f"{key}: docs/figures.json records {want} for this CPU kind, the code gives {got}")
    return out


def invariants(measured: dict, facts: dict) -> list[str]:
    """What must hold on any CPU kind: a list of what did not."""
    f, out = measured["figures"], []
    low, high = facts["warm_start_window_pct"]
    if facts["warm_start_stop_reason"] != "in_window" or not low <= f["warm_start_pass_rate_pct"] <= high:
        out.append(f"the warm start stopped with reason {facts['warm_start_stop_reason']!r} at sampled pass rate "
                   f"{f['warm_start_pass_rate_pct']} %, not inside its window [{low}, {high}] %")
    rise = round(f["heldout_acc_sampled_end_pct"] - f["heldout_acc_sampled_start_pct"], 1)
    if rise < MIN_RISE_PP:
        out.append(f"held-out sampled accuracy rose by {rise} pp, less than {MIN_RISE_PP} pp")
    if f["heldout_acc_greedy_end_pct"] < f["heldout_acc_greedy_start_pct"]:
        out.append(f"held-out greedy accuracy fell: {f['heldout_acc_greedy_start_pct']} % -> "
                   f"{f['heldout_acc_greedy_end_pct']} %")
    if facts["replayed_rows"] <= 0:
        out.append("the paper's method replayed no rows (replay/count is 0 at every step)")
    return out


def render(figures: dict) -> str:
    rec = figures["kinds"][figures["readme_kind"]]
    f, t = rec["figures"], rec["timings"]
    minutes, seconds = divmod(round(t["main_job_seconds"]), 60)
    others = [
        f"{k['machine_kind']}: step {k['figures']['warm_start_step']}, sampled "
        f"{k['figures']['heldout_acc_sampled_start_pct']:.1f} % -> {k['figures']['heldout_acc_sampled_end_pct']:.1f} %"
        for key, k in sorted(figures["kinds"].items()) if key != figures["readme_kind"]
    ]
    other = (" Another CPU kind gives other numbers (" + "; ".join(others) + "; "
             "[spread](docs/testbed.md#one-seed-several-cpu-kinds)).") if others else ""
    return (
        f"{BEGIN}\n"
        f"Measured with `{figures['command']}` from an empty warm-start cache at commit `{rec['commit']}` "
        f"({rec['machine']}): {minutes} min {seconds:02d} s, the warm start {t['warm_start_seconds']:.0f} s of that "
        f"(stopped at step {f['warm_start_step']}, sampled pass rate {f['warm_start_pass_rate_pct']:.1f} %); "
        f"held-out sampled accuracy {f['heldout_acc_sampled_start_pct']:.1f} % -> "
        f"{f['heldout_acc_sampled_end_pct']:.1f} %, greedy {f['heldout_acc_greedy_start_pct']:.1f} % -> "
        f"{f['heldout_acc_greedy_end_pct']:.1f} %.{other} CI reruns it (`scripts/update_docs_figures.py --check`): "
        f"exact on a recorded kind, elsewhere the properties all kinds share.\n"
        f"{END}"
    )


def write_readme(figures: dict) -> None:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README}: the figures:quickstart markers are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(head + render(figures) + tail)


def check(figures: dict, key: str, measured: dict, facts: dict) -> list[str]:
    problems = invariants(measured, facts)
    if key in figures["kinds"]:
        problems += drift(figures["kinds"][key], measured)
    if figures.get("readme_kind") not in figures["kinds"]:
        problems.append("docs/figures.json names no recorded CPU kind for the README's paragraph (readme_kind)")
    elif README.read_text().count(render(figures)) != 1:
        problems.append("README's figures paragraph is not the one docs/figures.json renders")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="check against docs/figures.json instead of recording")
    ap.add_argument("--readme", action="store_true", help="make this CPU kind the one the README's paragraph shows")
    ap.add_argument("--figures", type=Path, default=FIGURES, help="the recorded figures (default docs/figures.json)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for the main job, with --check only: to show the check fails on broken training")
    ap.add_argument("--run", type=Path, default=None, metavar="RUN_DIR",
                    help="with --check: check this finished run of the main job instead of running it again")
    args = ap.parse_args(argv)
    if args.set and not args.check:
        ap.error("--set is for --check only: recorded figures are those of the default main job")
    if args.run is not None and (not args.check or args.set):
        ap.error("--run is for --check without --set: it checks a run of the default main job")
    figures = json.loads(args.figures.read_text()) if args.figures.exists() else {"command": COMMAND, "kinds": {}}
    kind = this_kind()
    key = kind_key(kind)
    extra = [a for kv in args.set for a in ("--set", kv)]
    readme = args.readme or figures.get("readme_kind") in (None, key)
    if args.run is not None:
        problems = finished_main_job(args.run)
        for p in problems:
            print(f"cannot check {args.run}: {p}", file=sys.stderr)
        if problems:
            return 2
        measured, facts = read_run(args.run, None)
    else:
        with tempfile.TemporaryDirectory(prefix="grpo-replay-figures-") as tmp:
            measured, facts = run_main_job(Path(tmp), extra)
            if not args.check and readme:  # the README's picture: the main job next to plain GRPO, same warm start
                cli(Path(tmp), "train", "--no-progress", "--preset", "grpo", "--out", str(Path(tmp) / "grpo-seed0"))
                cli(Path(tmp), "plot", "paper-seed0", "grpo-seed0", "--out", str(PLOT))
    print(f"CPU kind: {key}")
    print(f"measured: {json.dumps(measured)}")
    if args.check:
        problems = check(figures, key, measured, facts)
        for p in problems:
            print(f"check failed: {p}", file=sys.stderr)
        if key not in figures["kinds"] and not problems:
            print(f"this CPU kind is not in {args.figures.name}; the properties every kind shares hold. Record its "
                  "figures with a plain run of this script (without --check) and commit them.")
        return 1 if problems else 0
    problems = invariants(measured, facts)
    if problems:
        for p in problems:
            print(f"not recorded: {p}", file=sys.stderr)
        return 1
    figures["kinds"][key] = {"commit": git_commit(ROOT), "machine": describe_machine(kind),
                             "machine_kind": cpu_kind(kind), **kind, **measured}
    if readme:
        figures["readme_kind"] = key
    args.figures.write_text(json.dumps(figures, indent=1) + "\n")
    write_readme(figures)  # the paragraph names every recorded kind, so a new one changes it too
    print(render(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
