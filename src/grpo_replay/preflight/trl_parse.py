"""A TRL launch resolved by the tools that run it, with the launch's world size.

`accelerate launch` is resolved by accelerate's own parser and `_validate_launch_command` (the config file named by
`--config_file`, or the machine's default config exactly when accelerate reads it; `--num_processes` over both),
so its own refusals (`--multi_gpu` with one process, say) are found here. The script's dataclasses (read by
`trl_script`, never run) are then parsed by `TrlParser` as the script would parse them, except that every
`TrainingArguments` subclass reports the launch's process count as its `world_size`: GRPOConfig's
`__post_init__` sizes the generation batch (and checks its groups) with it, so an 8-process launch is checked as 8
processes. A failed check of accelerate, TRL or transformers becomes a `LaunchRefused` naming the setting as the
user typed it (`--flag` on the command line, `key` in the YAML).
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import re
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Optional

from .trl_script import LaunchRefused, ScriptSpec


@dataclass
class Launch:
    processes: int  # all machines together, as accelerate counts them
    machines: int
    script: str  # as typed
    argv: list[str]  # the script's arguments
    mixed_precision: str = "no"
    fsdp2: bool = False
    deepspeed: bool = False
    notes: list[str] = field(default_factory=list)


def split_launch(launch: list[str], host_gpus: int) -> Launch:
    """The processes, machines and script arguments of `accelerate launch ...` or `python SCRIPT.py ...`."""
    if launch[:2] != ["accelerate", "launch"]:
        script = launch[1]
        _need_file(script, script, "the path of the TRL script")
        return Launch(1, 1, script, launch[2:])
    from accelerate.commands import launch as acc

    default_config_file = acc.default_config_file  # the one its _validate_launch_command reads
    args = _argparse(acc.launch_command_parser(), launch[2:], "accelerate launch")
    _need_file(args.training_script, args.training_script, "the path of the TRL script")
    notes = []
    if args.config_file is not None:
        _need_file(args.config_file, "--config_file", "the path of an accelerate config file "
                   "(examples/trl/accelerate_multi_gpu.yaml), or no --config_file")
    elif os.path.isfile(default_config_file) and not args.cpu:  # accelerate reads it then, and only then
        notes.append(f"accelerate's default config {default_config_file} (read by accelerate launch without "
                     "--config_file; the GPU host's own default config applies there)")
    elif args.num_processes is None:  # accelerate starts one process per GPU it sees on the launching host
        args.num_processes = max(host_gpus, 1)
        notes.append(f"no --num_processes and no accelerate config: accelerate starts one process per visible "
                     f"GPU; planned as {args.num_processes} (this host's GPUs; give --num_processes for another host)")
    log = logging.getLogger(acc.__name__)
    level, log.level = log.level, logging.ERROR  # its "values were not passed" warning
    try:
        args, _, _ = acc._validate_launch_command(args)
    except (ValueError, FileNotFoundError) as e:
        flag = re.search(r"--[\w-]+", str(e))
        raise LaunchRefused(flag.group(0) if flag else "accelerate launch", f"accelerate refuses it: {e}",
                            "the accelerate settings its message asks for") from None
    finally:
        log.level = level
    processes, machines = int(args.num_processes or 1), int(args.num_machines or 1)
    return Launch(processes, machines, args.training_script, list(args.training_script_args),
                  mixed_precision=str(args.mixed_precision or "no"),
                  fsdp2=bool(args.use_fsdp) and str(getattr(args, "fsdp_version", 1)) == "2",
                  deepspeed=bool(args.use_deepspeed), notes=notes)


def as_typed(name: str, argv: list[str]) -> str:
    """`--name` when the launch's command line sets it, else the YAML key `name`."""
    return f"--{name}" if any(a == f"--{name}" or a.startswith(f"--{name}=") for a in argv) else name


def _need_file(path: str, field_name: str, fix: str) -> None:
    if not Path(path).expanduser().is_file():
        raise LaunchRefused(field_name, f"{path} does not exist", fix)


def _argparse(parser, argv: list[str], what: str):
    """argv parsed by `parser`; its usage error as a LaunchRefused naming the flag."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(argv)
    except SystemExit:
        message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"{what}: usage error"
        flag = re.search(r"argument (--?[\w-]+)", message)
        raise LaunchRefused(flag.group(1) if flag else what, message.split("error: ", 1)[-1],
                            f"a value {what} accepts") from None


def with_world_size(cls: type, processes: int) -> type:
    """`cls` whose `world_size` is the launch's process count (a TrainingArguments subclass), else `cls`."""
    from transformers import TrainingArguments

    if not (isinstance(cls, type) and issubclass(cls, TrainingArguments)):
        return cls
    return type(cls.__name__, (cls,), {"world_size": property(lambda self: processes),
                                       "__module__": cls.__module__, "__doc__": cls.__doc__})


def parse_script_args(spec: ScriptSpec, launch: Launch) -> dict[str, object]:
    """{class name: instance} as the script's `TrlParser` builds them from the launch's arguments and YAML."""
    import yaml
    from transformers import TrainingArguments
    from trl import TrlParser

    argv = list(launch.argv)
    yaml_keys: set[str] = set()
    if "--config" in argv:
        at = argv.index("--config")
        path = argv[at + 1] if at + 1 < len(argv) else ""
        _need_file(path, "--config", "the path of the script's YAML config (examples/trl/*.yaml)")
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as e:
            raise LaunchRefused("--config", f"{path} is not valid YAML ({e})", "fix the YAML") from None
        yaml_keys = set(loaded) if isinstance(loaded, dict) else set()
    classes = [with_world_size(c, launch.processes) for c in spec.classes]
    if any(issubclass(c, TrainingArguments) for c in classes):  # no field read here depends on the device
        argv += ["--use_cpu", "true"]
    known = [f.name for c in classes if is_dataclass(c) for f in fields(c)]
    env = dict(os.environ)  # TrlParser exports the YAML's `env:` mapping into this process
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parsed = TrlParser(tuple(classes)).parse_args_and_config(args=argv)
    except SystemExit:  # argparse's usage error (a bad value or choice)
        message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "usage error"
        flag = re.search(r"(?:argument|ambiguous option:) (--[\w-]+)", message)
        raise LaunchRefused(flag.group(1) if flag else "launch", message.split("error: ", 1)[-1],
                            "a value the script's parser accepts") from None
    except (ValueError, TypeError) as e:
        raise refusal_of(str(e), known, launch.argv, yaml_keys, launch.processes) from None
    finally:
        os.environ.clear()
        os.environ.update(env)
    return {c.__name__: v for c, v in zip(spec.classes, parsed)}


# Fields a message may name that the user sets through others (GRPOConfig derives the generation batch), and the
# fields of messages that name none.
DERIVED = {"generation_batch_size": ("per_device_train_batch_size", "steps_per_generation",
                                     "gradient_accumulation_steps")}
MEANS = ((r"at least 2 generations per prompt", ("num_generations",)),
         (r"global eval batch size", ("per_device_eval_batch_size", "num_generations_eval", "num_generations")))
# TRL / transformers check -> the fix, from the message's own numbers where it has them
FIXES = ((r"both configured at the same time", lambda m, f: "only one of generation_batch_size and "
          "steps_per_generation (the other left out of the YAML and the command line)"),
         (r"At most one of fp16 and bf16", lambda m, f: "only one of bf16 and fp16 set to true"),
         (r"at least 2 generations per prompt", lambda m, f: "num_generations >= 2"),
         (r"must be divisible by the global batch size \((\d+)\)",
          lambda m, f: f"generation_batch_size a multiple of {m.group(1)} (per-device batch x processes)"),
         (r"(\w+) \(([\d.e+-]+)\) must be less than (\w+) \(([\d.e+-]+)\)",
          lambda m, f: f"{m.group(1)} below {m.group(3)} ({m.group(4)})"))


def refusal_of(message: str, known: list[str], argv: list[str], yaml_keys: set[str], processes: int) -> LaunchRefused:
    """A check of TRL / transformers that failed, as a refusal of the setting the user typed."""
    unknown = re.search(r"not used by the HfArgumentParser: \[['\"](--?[\w.-]+)", message)
    if unknown:
        return LaunchRefused(unknown.group(1), f"the script's parser has no such argument ({message})",
                             "an argument of the script's dataclasses (see its --help), spelled as TRL spells it")
    unknown = re.search(r"Unknown arguments from config file: \[['\"](?:--)?([\w.-]+)", message)
    if unknown:
        return LaunchRefused(unknown.group(1), f"the YAML key is no field of the script's dataclasses ({message})",
                             "a key the script's dataclasses define, or remove it")
    on_cli = {a[2:].split("=")[0] for a in argv if a.startswith("--")}
    named = sorted((m.start(), k) for k in set(known) for m in [re.search(rf"(?<![\w.]){re.escape(k)}(?!\w)", message)]
                   if m)
    mentioned = [k for _, k in named] + [k for pattern, ks in MEANS if re.search(pattern, message) for k in ks]
    derived = [d for k in mentioned for d in DERIVED.get(k, ())]
    field_name = next((f"--{k}" for k in mentioned + derived if k in on_cli), None) \
        or next((k for k in mentioned + derived if k in yaml_keys), None) or (mentioned[0] if mentioned else "launch")
    return LaunchRefused(field_name, f"the config's own check refuses it: {message}",
                         _fix(message, field_name, processes))


def _fix(message: str, field_name: str, processes: int) -> str:
    groups = re.search(r"\((\d+)\) must be divisible by num_generations \((\d+)\)", message)
    if groups:
        n, k = int(groups.group(1)), int(groups.group(2))
        ok = [d for d in range(2, min(n, 2 * k) + 1) if n % d == 0][-3:]
        return (f"num_generations dividing {n} ({', '.join(map(str, ok)) or 'none >= 2'}), or a per-device batch x "
                f"steps_per_generation x {processes} process(es) that is a multiple of {k}")
    evals = re.search(r"\((\d+) \* (\d+)\) must be divisible by the number of generations used for evaluation \((\d+)",
                      message)
    if evals:
        p, k = int(evals.group(2)), int(evals.group(3))
        return f"per_device_eval_batch_size a multiple of {k // math.gcd(k, p)} (x {p} process(es) divisible by {k})"
    for pattern, fix in FIXES:
        if (m := re.search(pattern, message)):
            return fix(m, field_name)
    advice = re.findall(r"((?:Set|Please set|Please|Enable|Use|Remove|Launch)\b[^.]*\.)", message)
    return " ".join(advice) if advice else f"change {field_name} as the message says"
