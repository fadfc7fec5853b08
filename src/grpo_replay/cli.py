"""`grpo-replay` command line: train | eval | compare | plot."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

# Subcommand -> module providing `add_arguments(parser)` and `run(args) -> int`; imported lazily so that
# `grpo-replay --help` stays fast and an optional extra missing for one command does not break the others.
COMMANDS = {
    "train": ("grpo_replay.trainer.command", "Train with GRPO + replay (default: the embedded testbed, paper preset)."),
    "eval": ("grpo_replay.eval.command", "Evaluate a model on math benchmarks (mean@n, pass@k, AES, lengths)."),
    "compare": ("grpo_replay.experiments.command", "Run the paper's comparisons and ablations over seeds."),
    "plot": ("grpo_replay.experiments.plot_runs", "Plot run directories on shared axes with a table of final metrics."),
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="grpo-replay", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
