"""The preflight of a TRL script launch (examples/trl): `accelerate launch [its args] SCRIPT.py --config YAML
[overrides]` or `python SCRIPT.py ...`.

The launch is resolved with the tools that run it: accelerate's own launch parser and config loader give the
processes and machines; the script's own `TrlParser` (its dataclasses, read off the script's source) gives its
`ReplayGRPOConfig` / `ReplayAsyncGRPOConfig` from the YAML and the overrides; the script's own `preflight` (the
packages it needs) and the trainer's own share check (`integrations/trl/batch_share.py`) judge it.
"""
from __future__ import annotations

import ast
import importlib.util
import math
import sys
from pathlib import Path
from typing import Optional

from ..app.run_files import TRL_CHECKPOINT_PREFIX
from ..step_plan import plan_step
from ..trainer import memory
from .host import Host, check_stack
from .report import Report
from .shapes import model_shape
from .train_run import GIB, target_cards


def split_launch(launch: list[str]) -> tuple[int, int, str, list[str]]:
    """(processes, machines, script, script args) of an `accelerate launch ...` or `python SCRIPT ...` line."""
    if launch[:2] == ["accelerate", "launch"]:
        from accelerate.commands.config.config_args import load_config_from_file
        from accelerate.commands.launch import launch_command_parser

        args = launch_command_parser().parse_args(launch[2:])
        file_cfg = load_config_from_file(args.config_file) if args.config_file else None
        processes = args.num_processes or getattr(file_cfg, "num_processes", None) or 1
        machines = args.num_machines or getattr(file_cfg, "num_machines", None) or 1
        return int(processes), int(machines), args.training_script, list(args.training_script_args)
    return 1, 1, launch[1], launch[2:]  # python SCRIPT.py ...


def parse_script_args(script: str, argv: list[str], gpu_host: bool) -> tuple:
    """The script's dataclasses as its own `TrlParser((...))` call builds them from `argv` (on a host without a GPU
    with `--use_cpu true` added, since transformers validates bf16 against the device; no field read here depends
    on it)."""
    from trl import TrlParser

    path = Path(script)
    names = _parser_dataclasses(path.read_text())
    spec = importlib.util.spec_from_file_location(f"_preflight_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(path.resolve().parent))  # as for a script run: its folder first on the path
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.resolve().parent))  # defines the script's classes; its main() is not run
    argv = argv if gpu_host else [*argv, "--use_cpu", "true"]
    parsed = TrlParser(tuple(getattr(module, n) for n in names)).parse_args_and_config(args=argv)
    return module, dict(zip(names, parsed))


def _parser_dataclasses(source: str) -> list[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "TrlParser" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Tuple):
                return [e.id for e in arg.elts if isinstance(e, ast.Name)]
    raise ValueError("the script builds no TrlParser((...)) of its dataclasses")


def check_trl_launch(launch: list[str], host: Host, gpu_memory: Optional[int]) -> Report:
    processes, machines, script, argv = split_launch(launch)
    report = Report(" ".join(launch))
    module, parsed = parse_script_args(script, argv, bool(host.gpus))
    args = next(v for v in parsed.values() if hasattr(v, "replay_preset"))
    model_name = next((getattr(v, "model_name_or_path") for v in parsed.values()
                       if getattr(v, "model_name_or_path", None)), None)
    per_node = math.ceil(processes / machines)
    check_stack(host, "main", True, per_node, report)
    report.add("processes", f"{processes} process(es) on {machines} machine(s): {per_node} GPU(s) per node")
    _check_packages(module, args, host, report)
    _check_master_weights(args, report)
    async_trainer = not hasattr(args, "steps_per_generation")
    share = _check_share(args, processes, async_trainer, report)
    _check_memory(args, model_name, share, async_trainer, host, gpu_memory, report)
    report.add("seeds", f"seed {args.seed} (data order, sampling); replay buffer seed "
                        f"{args.replay_seed if args.replay_seed is not None else args.seed} + process index")
    _check_output_dir(args, report)
    data = next((v for v in parsed.values() if hasattr(v, "dataset_name")), None)
    if data is not None:
        report.add("data", f"{data.dataset_name} (split {data.dataset_split}): a Hugging Face dataset the script loads "
                           "at start (needs the hub or a local cache)")
    return report


def _check_packages(module, args, host: Host, report: Report) -> None:
    """The script's own `preflight`: packages it needs and lacks. On a CPU host (vLLM is GPU only) they are what
    the GPU host must have."""
    missing = module.preflight(args) if hasattr(module, "preflight") else []
    for line in missing:
        if host.torch_cuda:
            report.refuse("packages", line, "install it as the line says")
        else:
            report.add("software", f"the GPU host needs: {line}")


def _check_master_weights(args, report: Report) -> None:
    """The weights the optimizer updates must be float32: TRL's bf16=True is autocast over them. Loaded in bf16
    (the async config's `dtype`, or `model_init_kwargs`), AdamW's updates at an RL learning rate mostly round away
    while the run logs as usual."""
    dtype = getattr(args, "dtype", None) or (getattr(args, "model_init_kwargs", None) or {}).get("dtype")
    if str(dtype).replace("torch.", "") in ("bfloat16", "float16"):
        key = "dtype" if getattr(args, "dtype", None) else "model_init_kwargs.dtype"
        report.refuse(key, f"{dtype} weights are what AdamW updates (no float32 master copy): at learning_rate="
                      f"{args.learning_rate:g} most updates round away", "dtype: float32 with bf16: true (autocast "
                      "over float32 weights)")


def _check_share(args, processes: int, async_trainer: bool, report: Report):
    from ..errors import UsageError

    cfg = args.to_replay_config()
    if async_trainer:  # AsyncComposer: chunks of per_device x processes x GA samples keep TRL's size
        S = args.per_device_train_batch_size * processes * args.gradient_accumulation_steps
        try:  # the composer's own check: a composition without a fixed-size rule, replay that would vanish
            from ..integrations.trl.async_composer import check_chunk

            s = check_chunk(cfg, S, args.num_generations)
        except UsageError as e:
            report.refuse_error(e, field_name="per_device_train_batch_size / gradient_accumulation_steps")
            return None
        replay = s.replay
        report.add("replay rows per step", f"{S} samples per optimizer step: {s.kept} fresh + {replay} replay "
                                           f"(share {replay / S:.3f} vs configured {s.configured:.3f}, the "
                                           "composer trims trailing replay rows to keep TRL's step size)")
        return None
    fresh = args.per_device_train_batch_size * args.steps_per_generation
    generation = fresh * processes
    if generation % args.num_generations:
        report.refuse("per_device_train_batch_size", f"the generation batch of {generation} rows "
                      f"({processes} processes x {fresh}) is not a multiple of num_generations={args.num_generations}",
                      "a per-device batch x steps_per_generation x processes divisible by num_generations")
    try:
        from ..integrations.trl.batch_share import check_share

        share = check_share(args, cfg, 1)  # args resolved in this one process: its batch is one process's
    except UsageError as e:
        report.refuse_error(e, field_name="per_device_train_batch_size / steps_per_generation")
        share = plan_step(fresh, cfg, args.steps_per_generation, group_size=args.num_generations)
    report.add("replay rows per step", f"per process: {share.kept} fresh + {share.planned} replay planned -> "
                                       f"{share.replay} after TRL's split into steps_per_generation="
                                       f"{share.unit} micro-batches of {share.rows // share.unit} rows (the YAML's "
                                       f"per_device_train_batch_size={args.per_device_train_batch_size} x "
                                       f"{share.rows // share.unit / args.per_device_train_batch_size:.2f}); share "
                                       f"{share.share:.3f} vs configured {share.configured:.3f}")
    return share


def _check_memory(args, model_name, share, async_trainer: bool, host: Host, gpu_memory, report: Report) -> None:
    section = "memory per GPU"
    shape, source = model_shape(model_name)
    if shape is None:
        report.add(section, f"not estimated: {source}")
        return
    micro = share.rows // share.unit if share is not None else args.per_device_train_batch_size
    precision = "bf16" if args.bf16 else "fp32"
    colocate = getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", "") == "colocate"
    ckpt = bool(getattr(args, "gradient_checkpointing", False))
    report.add(section, f"{model_name}: {shape.params / 1e9:.3g}B parameters ({source}); {micro} rows per forward, "
                        f"{args.max_completion_length} completion tokens, update in {precision}"
                        + (", activation checkpointing" if ckpt else ""))
    fits = []
    for name, card in target_cards(host, gpu_memory).items():
        vllm = int(args.vllm_gpu_memory_utilization * card) if colocate else 0
        ph = memory.phases(shape, rows=0 if colocate else args.per_device_train_batch_size * getattr(
            args, "steps_per_generation", 1), micro_rows=micro, eval_rows=0, completion=args.max_completion_length,
            precision=precision, vllm_bytes=vllm, prompt=memory.PROMPT_ROOM, checkpointed=ckpt)
        total = 4 * shape.params + ph.need
        report.add(section, f"{name}: weights {4 * shape.params / GIB:.1f} + AdamW {ph.adamw / GIB:.1f} + vLLM's share "
                            f"{ph.vllm / GIB:.1f} + the largest phase ({ph.peak_phase()}, update "
                            f"{ph.update / GIB:.1f}) = {total / GIB:.1f} GiB")
        if total <= card:
            fits.append(name)
    report.fits(section, fits, "per_device_train_batch_size", f"the update needs more than any target card holds "
                f"({micro} rows per forward)", "a smaller per_device_train_batch_size (more steps_per_generation), "
                "gradient_checkpointing, or a larger card")


def _check_output_dir(args, report: Report) -> None:
    out = Path(args.output_dir)
    ckpts = sorted(out.glob(TRL_CHECKPOINT_PREFIX + "*"), key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit() else -1)
    resume = getattr(args, "resume_from_checkpoint", None)
    if resume:
        there = Path(resume).is_dir()
        report.add("checkpoints", f"{out}: RESUMES from {resume}" + ("" if there else " (missing)"))
        if not there:
            report.refuse("resume_from_checkpoint", f"{resume} does not exist", "a checkpoint-N folder of the run")
    elif ckpts:
        report.refuse("output_dir", f"{out} holds {ckpts[-1].name} of an earlier run, and the script starts over "
                      "(resume_from_checkpoint unset), writing its checkpoints among them",
                      f"--resume_from_checkpoint {ckpts[-1]} to continue it, or a new --output_dir")
    else:
        report.add("checkpoints", f"{out}: new run")
