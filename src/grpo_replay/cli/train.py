"""`grpo-replay train`: flags for the common fields, `--config FILE`, and `--set key=value` for any field."""
from __future__ import annotations

import argparse
import sys

from ..app import configio
from ..errors import ConfigError
from ..config import PRESETS
from ..tasks.testbed.testbed_config import TESTBED_PRESETS
from ..trainer.train_config import BACKENDS, DEVICES, REWARDS

# Common fields get their own flag; every field (dotted, e.g. replay.tau_max) is reachable with --set.
SHORT_FLAGS = {
    "preset": dict(choices=PRESETS),
    "testbed_preset": dict(choices=TESTBED_PRESETS),
    "seed": dict(type=configio.int_arg),
    "steps": dict(type=configio.int_arg),
    "backend": dict(choices=BACKENDS),
    "model": dict(),
    "data": dict(),
    "reward": dict(choices=REWARDS),
    "out_dir": dict(),
    "device": dict(choices=DEVICES),
    "report_to": dict(nargs="+", metavar="TRACKER"),
}

FLAG_NAMES = {"out_dir": "--out", "testbed_preset": "--testbed"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..trainer.train_config import FIELDS

    p.add_argument("--config", action=configio.once(), type=configio.path_arg, help="YAML file of config keys (nested or dotted); flags override it")
    for name, kw in SHORT_FLAGS.items():
        flag = FLAG_NAMES.get(name, f"--{name.replace('_', '-')}")
        aliases = ["--report_to"] if name == "report_to" else []  # TRL's spelling too
        p.add_argument(flag, *aliases, dest=name, default=None, help=FIELDS[name][1], action=configio.once(), **kw)
    p.add_argument("--no-progress", action="store_true", help="Hide the progress bar.")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override any config key, e.g. --set replay.tau_max=5 --set loss.eps_high=0.3 (see --list-keys).",
    )
    p.add_argument("--list-keys", action="store_true", help="Print every config key with its help and exit.")


def overrides_from_args(args: argparse.Namespace) -> dict:
    out = {name: getattr(args, name) for name in SHORT_FLAGS if getattr(args, name) is not None}
    given = {name: configio.as_given(FLAG_NAMES.get(name, "--" + name.replace("_", "-")), v) for name, v in out.items()}
    if args.no_progress:
        out["progress"], given["progress"] = False, "--no-progress"
    out.update(configio.parse_sets(args.set, given))
    return out


def _with_run_dir_of_config(overrides: dict, config: str | None) -> dict:
    """`--config RUN/config.yaml` without --out resumes RUN, the directory the file lives in: the out_dir inside it
    may be relative to where the run was started, or the run may have moved since."""
    from pathlib import Path

    from ..trainer.rundir import holds_run

    if not config or "out_dir" in overrides or not holds_run(Path(config).parent):
        return overrides
    run_dir = str(Path(config).parent).replace("{", "{{").replace("}", "}}")  # out_dir is a format template
    return {**overrides, "out_dir": run_dir}


def config_from_args(args: argparse.Namespace, machine: bool = True):
    """The validated TrainConfig of the command line; any problem with it is a ConfigError (no compute yet).
    `machine`: also refuse what this machine cannot run (False: the preflight of a launch meant for another)."""
    from ..trainer.train_config import check_machine, resolve

    try:
        cfg = resolve(_with_run_dir_of_config(overrides_from_args(args), args.config), args.config)
    except ConfigError:
        raise
    except (ValueError, TypeError, RecursionError) as e:
        # e.g. a YAML value the YAML parser itself rejects (`seed: 2001-13-45`) or nests too deeply
        raise ConfigError(f"cannot parse the configuration: {type(e).__name__}: {e}") from None
    if machine:
        check_machine(cfg)
    try:
        cfg.run_dir
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
        raise ConfigError(
            f"TrainConfig.out_dir={cfg.out_dir!r} is invalid ({type(e).__name__}: {e}); placeholders allowed: {{preset}}, {{seed}}"
        ) from None
    return cfg


def run(args: argparse.Namespace) -> int:
    from ..trainer.train_config import FIELDS, TrainConfig

    if args.list_keys:
        groups, heading = configio.field_groups(TrainConfig), None
        for k, (t, doc) in FIELDS.items():
            group = groups.get(k.split(".", 1)[0], "")
            if group != heading:  # the dataclass's own headings, as in train_config.py
                print(("\n" if heading is not None else "") + f"# {group}")
                heading = group
            print(f"{k}: {doc}")
        return 0
    cfg = config_from_args(args)  # a ConfigError here, or any UsageError / Stopped below: exit code by cli.main
    from ..trainer.setup import check_data_rows

    # A path the user gave that is not there raises InputNotFound (a UsageError: exit 2); any other error, a
    # FileNotFoundError mid-training included, is not bad input and keeps its traceback.
    if cfg.reward == "math":
        check_data_rows(cfg)  # before the run directory is claimed or the model loads
    if cfg.backend == "trl":
        from ..trainer.trl.backend import train_with_trl

        summary = train_with_trl(cfg)
    else:
        from ..trainer.loop import train

        summary = train(cfg)
    _print_summary(cfg, summary)
    return 0


def _print_summary(cfg, s: dict) -> None:
    a, g = s["heldout_acc_sampled"], s["heldout_acc_greedy"]
    print(
        f"\n{cfg.preset} seed {cfg.seed}: {s['steps']} steps, {s['generated_rollouts']} generated rollouts\n"
        f"  held-out accuracy (sampled mean@{s['final_eval'].get('n_samples', '?')}): "
        f"warm start {a['start']:.3f} -> end {a['end']:.3f} ({a['end'] - a['start']:+.3f})\n"
        f"  held-out accuracy (greedy):            warm start {g['start']:.3f} -> end {g['end']:.3f} ({g['end'] - g['start']:+.3f})\n"
        f"  run directory: {cfg.run_dir}"
    )
    sys.stdout.flush()
