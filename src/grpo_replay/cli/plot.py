"""`grpo-replay plot RUN_DIR... [--out FILE]`: several training runs on shared axes, plus a table of final metrics
(the figure and the table: `grpo_replay.plotting.overlay`)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..app.configio import path_arg
from ..app.run_files import SUMMARY
from ..errors import UsageError
from ..plotting.overlay import NotARunError, format_table, label_runs, write_table, final_metrics, load_run, plot_runs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", type=path_arg, metavar="RUN_DIR", help="Run directories (each with config.yaml and metrics.jsonl).")
    p.add_argument("--out", type=path_arg, default="plot.png", help="PNG to write; the table goes beside it as .csv and .json (default plot.png).")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise UsageError(f"--out {out} must be a .png file")
    given: dict[Path, str] = {}
    for d in args.run_dirs:
        # one run twice would be two rows of one curve, labelled alike; a typo in a sweep's list, never meant
        if (key := Path(d).resolve()) in given:
            raise UsageError(f"{d} is given twice (as {given[key]} and {d}); give each run once")
        given[key] = d
    runs, errors = [], []
    for d in args.run_dirs:
        try:
            runs.append(load_run(Path(d)))
        except NotARunError as e:
            errors.append(e)
    if len(errors) == 1:
        raise errors[0]
    if errors:  # every bad directory at once, so one fix of the command line serves
        raise NotARunError(f"{len(errors)} of the run directories cannot be plotted:\n  " + "\n  ".join(map(str, errors)))
    for r in runs:
        if not r["finished"]:
            print(
                f"grpo-replay plot: note: {r['run_dir']} is unfinished (step {r['steps_done']} of {r['steps']}, "
                f"no {SUMMARY}); plotted up to its last step",
                file=sys.stderr,
            )
    label_runs(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = [final_metrics(r) for r in runs]
    plot_runs(runs, out)
    write_table(table, out)
    print(format_table(table))
    print(f"grpo-replay plot: wrote {out}, {out.with_suffix('.csv')}, {out.with_suffix('.json')}")
    return 0
