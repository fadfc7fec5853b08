"""`grpo-replay preflight LAUNCH...`: resolve a launch exactly as it would run and print what it will do, before any
GPU time; exit 2 naming the field and the fix when it would fail or silently change the method (docs/preflight.md).

LAUNCH is the command line a user would type:
  grpo-replay train ARGS...          (or `train ARGS...`)
  grpo-replay compare ARGS...        (or `compare ARGS...`)
  accelerate launch [ACCELERATE ARGS] SCRIPT.py --config YAML [OVERRIDES]   (examples/trl; or python SCRIPT.py ...)
  [VAR=VALUE ...] bash examples/verl/run_paper_*.sh [OVERRIDES]
"""
from __future__ import annotations

import argparse
import math
from typing import Optional

from ..errors import UsageError

FORMS = ("grpo-replay train", "grpo-replay compare", "accelerate launch SCRIPT.py --config YAML",
         "python SCRIPT.py --config YAML", "[VAR=VALUE ...] bash examples/verl/SCRIPT.sh")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu-memory", default=None, metavar="GIB",
                   help="Memory per GPU of the machine the launch is for, in GiB (default: this host's GPU, or on a "
                        "host without one the 80 GB and 141 GB cards).")
    p.add_argument("launch", nargs=argparse.REMAINDER, help="The launch command line: " + " | ".join(FORMS))


def run(args: argparse.Namespace) -> int:
    from ..preflight.host import Host

    launch = list(args.launch)
    if launch and launch[0] == "--":
        launch = launch[1:]
    if not launch:
        raise UsageError("grpo-replay preflight needs the launch to check after it; allowed: " + " | ".join(FORMS))
    gpu_memory = gpu_memory_bytes(args.gpu_memory)
    report = resolve(launch, Host.detect(), gpu_memory)
    print(report.render(), flush=True)
    report.raise_if_refused()
    return 0


# GiB per GPU a card can have: from a small one to well above the largest sold (141 GB H200, 288 GB B300)
GPU_GIB = (1.0, 1024.0)


def gpu_memory_bytes(text: Optional[str]) -> Optional[int]:
    """--gpu-memory GIB as bytes (None: not given); UsageError naming it for anything but a card's size."""
    if text is None:
        return None
    try:
        gib = float(text)
    except ValueError:
        gib = math.nan
    if not GPU_GIB[0] <= gib <= GPU_GIB[1]:  # also nan and inf
        raise UsageError(f"--gpu-memory={text} is invalid; allowed: GiB per GPU, a number from {GPU_GIB[0]:g} to "
                         f"{GPU_GIB[1]:g} (e.g. 80 for an H100 80GB)")
    return int(gib * 2**30)


def resolve(launch: list[str], host, gpu_memory):
    """The report of `launch` on `host` (the launch form picks the resolver)."""
    words = launch[1:] if launch[0] in ("grpo-replay", "grpo_replay") else launch
    if words and words[0] == "train":
        return _train(words[1:], host, gpu_memory)
    if words and words[0] == "compare":
        return _compare(words[1:], host, gpu_memory)
    words_after_env = [w for w in launch if not ("=" in w and w.split("=")[0].isidentifier())]
    if words_after_env and (words_after_env[0] in ("bash", "sh") or words_after_env[0].endswith(".sh")):
        from ..preflight.verl_launch import check_verl_launch

        return check_verl_launch(launch, host, gpu_memory)
    if launch[:2] == ["accelerate", "launch"] or (launch[0].startswith("python") and len(launch) > 1
                                                  and launch[1].endswith(".py")):
        from ..preflight.trl_launch import check_trl_launch

        return check_trl_launch(launch, host, gpu_memory)
    raise UsageError(f"{' '.join(launch[:3])!r} is not a launch it knows; allowed: "
                     + " | ".join(FORMS))


def _parse(module, argv: list[str], prog: str) -> argparse.Namespace:
    """argv parsed by the command's own parser (argparse's usage errors exit 2 as the command would)."""
    p = argparse.ArgumentParser(prog=prog)
    module.add_arguments(p)
    return p.parse_args(argv)


def _train(argv: list[str], host, gpu_memory):
    from ..preflight.report import Report
    from ..preflight.train_run import check_train
    from . import train

    args = _parse(train, argv, "grpo-replay train")
    report = Report("grpo-replay train " + " ".join(argv))
    try:
        cfg = train.config_from_args(args, machine=False)  # this host may not be the GPU host the launch is for
    except UsageError as e:  # a setting the command itself refuses
        report.refuse_error(e)
        return report
    check_train(cfg, host, gpu_memory, report)
    return report


def _compare(argv: list[str], host, gpu_memory):
    from ..preflight.compare_runs import check_compare
    from ..preflight.report import Report
    from . import compare

    args = _parse(compare, argv, "grpo-replay compare")
    launch = "grpo-replay compare " + " ".join(argv)
    try:
        plan = compare.planned(args)
    except UsageError as e:  # what compare itself refuses while planning (a --set, a batch mapping)
        report = Report(launch)
        report.refuse_error(e)
        return report
    return check_compare(plan, host, gpu_memory, launch)
