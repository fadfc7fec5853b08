"""`grpo-replay` command line: train | eval | compare | plot | preflight.

Each command is a module of this package with `add_arguments(parser)` and `run(args) -> int`; `main` maps the
exception tree of `grpo_replay.errors` to exit codes for all of them."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from typing import Optional, Sequence

# Subcommand -> module providing `add_arguments(parser)` and `run(args) -> int`; imported lazily so that
# `grpo-replay --help` stays fast and an optional extra missing for one command does not break the others.
COMMANDS = {
    "train": ("grpo_replay.cli.train", "Train with GRPO + replay (default: the embedded testbed, paper preset)."),
    "eval": ("grpo_replay.cli.evaluate", "Evaluate a model on math benchmarks (mean@n, pass@k, AES, lengths)."),
    "compare": ("grpo_replay.cli.compare", "Run the paper's comparisons and ablations over seeds."),
    "plot": ("grpo_replay.cli.plot", "Plot run directories on shared axes with a table of final metrics."),
    "preflight": ("grpo_replay.cli.preflight", "Resolve a launch and print what it will do before any GPU time; "
                  "exit 2 naming the field and the fix when it would fail or change the method."),
}

# What the `app` extra installs, by import name: every command needs it, the core (`import grpo_replay`) does not.
APP_EXTRA = ("yaml", "transformers", "tokenizers", "accelerate", "datasets", "math_verify", "safetensors", "tqdm",
             "matplotlib")


def missing_app_extra() -> list[str]:
    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):  # a broken or half-removed install counts as missing
            return True

    return [name for name in APP_EXTRA if absent(name)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command. The exit-code contract, in one place: 0 done, 1 stopped (rerun to resume), 2 bad input
    (nothing computed); every command raises, and `grpo_replay.errors` maps what it raised to the code and the
    one line printed."""
    from ..errors import exit_code, headline

    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        return _dispatch(argv, command)
    except Exception as e:
        code = exit_code(e)
        if code is None:  # not one of ours: a bug, shown with its traceback
            raise
        print(headline(command or "", e), file=sys.stderr)
        return code


def _dispatch(argv: list[str], chosen: Optional[str]) -> int:
    from ..errors import MissingDependency

    parser = argparse.ArgumentParser(prog="grpo-replay", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    if chosen and (missing := missing_app_extra()):
        raise MissingDependency(
            f"the command needs the 'app' extra, which is not installed (missing: {', '.join(missing)}); install it "
            "with: pip install 'grpo-replay[app]' (from a clone: pip install -e '.[app]'). The core library (import "
            "grpo_replay) works without it.")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)  # argparse's own usage errors exit 2 with its usage line
    if args.command is None:
        parser.print_help()
        return 2
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
