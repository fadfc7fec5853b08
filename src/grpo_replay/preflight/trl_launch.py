"""The preflight of a TRL script launch (examples/trl): `accelerate launch [its args] SCRIPT.py --config YAML
[overrides]` or `python SCRIPT.py ...`.

The host's driver and stack are checked first (a host whose torch cannot see its GPUs still gets a report). The
launch is then resolved with the tools that run it (`trl_parse`): accelerate's own launch parser and validation give
the processes and machines, and the script's `TrlParser` dataclasses (read off its source by `trl_script`; nothing
of the script runs) parse the YAML and the overrides with the launch's world size, so TRL's own batch checks see the
real numbers. The packages the script imports, the weights the optimizer will step, the trainer's own share check
(`integrations/trl/batch_share.py`), memory, seeds and the output folder are judged on the result.
"""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Optional

from ..app.run_files import TRL_CHECKPOINT_PREFIX
from ..step_plan import plan_step
from ..trainer import memory
from .host import Host, check_stack
from .report import Report
from .shapes import KNOWN, model_shape
from .train_run import GIB, target_cards
from .trl_parse import Launch, as_typed, parse_script_args, split_launch
from .trl_script import LaunchRefused, ScriptSpec, read_script


def check_trl_launch(launch: list[str], host: Host, gpu_memory: Optional[int]) -> Report:
    report = Report(" ".join(launch))
    try:
        run = split_launch(launch, host.gpus)
    except LaunchRefused as e:
        check_stack(host, "main", True, 1, report)
        report.refuse(e.field, e.problem, e.fix)
        return report
    per_node = math.ceil(run.processes / run.machines)
    check_stack(host, "main", True, per_node, report)
    report.add("processes", f"{run.processes} process(es) on {run.machines} machine(s): {per_node} GPU(s) per node")
    for note in run.notes:
        report.add("processes", note)
    if launch[:2] != ["accelerate", "launch"] and host.gpus > 1:  # TRL's own check (nn.DataParallel)
        report.refuse(launch[0], f"one process on a host with {host.gpus} GPUs: Trainer wraps the model in "
                      "nn.DataParallel, which GRPOTrainer refuses", f"accelerate launch --num_processes {host.gpus} "
                      f"{' '.join(launch[1:2])} ..., or CUDA_VISIBLE_DEVICES=0 {' '.join(launch[:2])} ...")
    try:
        spec = read_script(Path(run.script))
        parsed = parse_script_args(spec, run)
        args = _replay_args(parsed, run.script)
    except LaunchRefused as e:
        report.refuse(e.field, e.problem, e.fix)
        return report
    for note in spec.notes:
        report.add("script", note)
    model_name = next((getattr(v, "model_name_or_path") for v in parsed.values()
                       if getattr(v, "model_name_or_path", None)), None)
    if model_name is None:
        report.refuse("--config" if "--config" not in run.argv else "model_name_or_path", "no model to train: "
                      "model_name_or_path is unset", "--config YAML with model_name_or_path (the recipe's "
                      "examples/trl/*.yaml), or --model_name_or_path NAME")
        return report
    _check_packages(spec, args, host, report)
    _check_master_weights(args, model_name, run, report)
    async_trainer = not hasattr(args, "steps_per_generation")
    share = _check_share(args, run.processes, async_trainer, report)
    _check_memory(args, model_name, share, async_trainer, host, gpu_memory, report, run.processes)
    report.add("seeds", f"seed {args.seed} (data order, sampling); replay buffer seed "
                        f"{args.replay_seed if args.replay_seed is not None else args.seed} + process index")
    _check_output_dir(args, report, run.argv)
    data = next((v for v in parsed.values() if hasattr(v, "dataset_name")), None)
    if data is not None:
        report.add("data", f"{data.dataset_name} (split {data.dataset_split}): a Hugging Face dataset the script loads "
                           "at start (needs the hub or a local cache)")
    return report


def _replay_args(parsed: dict, script: str):
    args = next((v for v in parsed.values() if hasattr(v, "replay_preset")), None)
    if args is None:
        raise LaunchRefused(script, f"its TrlParser builds {', '.join(parsed)}: no ReplayGRPOConfig or "
                            "ReplayAsyncGRPOConfig, so no replay settings to check", "parse a ReplayGRPOConfig "
                            "(ReplayGRPOTrainer) or ReplayAsyncGRPOConfig (ReplayAsyncGRPOTrainer), as examples/trl do")
    return args


# import name -> the grpo-replay extra that installs it; report_to name -> the module transformers imports
EXTRAS = {"math_verify": "app", "datasets": "app", "transformers": "app", "accelerate": "app", "yaml": "app",
          "trl": "trl", "vllm": "vllm", "tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow",
            "comet_ml": "comet_ml", "clearml": "clearml", "swanlab": "swanlab"}


def _check_packages(spec: ScriptSpec, args, host: Host, report: Report) -> None:
    """What the launch imports and this environment lacks: the script's imports (not under try/except), vLLM for
    use_vllm, and the report_to trackers. On a CPU host (vLLM is GPU only) they are what the GPU host must have."""
    needs = {m: f"the script imports `{m}`" for m, optional in spec.imports.items() if not optional}
    if getattr(args, "use_vllm", False):
        needs.setdefault("vllm", "use_vllm needs `vllm`")
    for name in args.report_to or []:
        if name in TRACKERS:
            needs.setdefault(TRACKERS[name], f"report_to {name} needs `{TRACKERS[name]}`")
    for module, why in needs.items():
        if importlib.util.find_spec(module) is not None:
            continue
        extra = EXTRAS.get(module)
        line = f"{why}: " + (f"pip install -e '.[{extra}]' in the grpo-replay checkout" if extra
                             else f"pip install the package that provides `{module}`")
        if host.torch_cuda:
            report.refuse("packages", line, "install it as the line says")
        else:
            report.add("software", f"the GPU host needs: {line}")


def _check_master_weights(args, model_name: str, run: Launch, report: Report) -> None:
    """The weights the optimizer updates must be float32: TRL's bf16=True is autocast over them. Loaded in bf16
    (the async config's `dtype`, or `model_init_kwargs`; "auto" takes the checkpoint's), AdamW's updates at an RL
    learning rate mostly round away while the run logs as usual. FSDP2 with mixed precision and DeepSpeed keep a
    float32 master copy (integrations/trl/master_weights.py)."""
    kwargs = getattr(args, "model_init_kwargs", None) or {}
    on_cli = as_typed("model_init_kwargs", run.argv).startswith("--")
    key = as_typed("dtype", run.argv) if getattr(args, "dtype", None) else (
        "--model_init_kwargs" if on_cli else "model_init_kwargs.dtype")
    dtype = str(getattr(args, "dtype", None) or kwargs.get("dtype") or "float32").replace("torch.", "")
    if dtype == "auto":
        dtype = _checkpoint_dtype(model_name)
    if dtype not in ("bfloat16", "float16") or (run.fsdp2 and run.mixed_precision != "no") or run.deepspeed:
        return
    report.refuse(key, f"{dtype} weights are what AdamW updates (no float32 master copy): at learning_rate="
                  f"{args.learning_rate:g} most updates round away", "dtype: float32 with bf16: true (autocast over "
                  "float32 weights), or an FSDP2 / DeepSpeed accelerate config (float32 master weights)")


def _checkpoint_dtype(model_name: str) -> str:
    """The dtype transformers' "auto" loads: the local config.json's, bfloat16 for the known Qwen3 checkpoints."""
    config = Path(model_name).expanduser() / "config.json"
    if config.is_file():
        c = json.loads(config.read_text())
        return str(c.get("dtype") or c.get("torch_dtype") or "float32")
    return "bfloat16" if model_name in KNOWN else "unknown"


def _check_share(args, processes: int, async_trainer: bool, report: Report):
    from ..errors import UsageError

    cfg = args.to_replay_config()
    if async_trainer:  # the composer's own chunk size, check and account of what a step holds
        from ..integrations.trl.async_composer import check_chunk, chunk_holds, chunk_size

        try:  # a composition without a fixed-size rule, replay that would vanish
            plan = check_chunk(cfg, chunk_size(args, processes), args.num_generations)
        except UsageError as e:
            report.refuse_error(e, field_name="per_device_train_batch_size / gradient_accumulation_steps")
            return None
        report.add("replay rows per step", chunk_holds(cfg, plan))
        return None
    fresh = args.per_device_train_batch_size * args.steps_per_generation
    generation = fresh * processes
    if generation % args.num_generations:
        report.refuse("per_device_train_batch_size", f"the generation batch of {generation} rows "
                      f"({processes} processes x {fresh}) is not a multiple of num_generations={args.num_generations}",
                      "a per-device batch x steps_per_generation x processes divisible by num_generations")
    try:
        from ..integrations.trl.batch_share import check_share

        share = check_share(args, cfg, processes)  # args parsed with the launch's world size
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


# The launch's key to change first, by the term that dominates (`Phases.dominant`), and the fix.
TRL_FIELDS = {
    "vllm": ("vllm_gpu_memory_utilization", "a lower vllm_gpu_memory_utilization (vLLM's KV cache), or "
             "vllm_enable_sleep_mode: true (the engine sleeps during the update)"),
    "update": ("per_device_train_batch_size", "a smaller per_device_train_batch_size (more steps_per_generation), "
               "gradient_checkpointing, or a larger card"),
    "scoring": ("per_device_train_batch_size", "a smaller per_device_train_batch_size, or a larger card"),
    "generation": ("use_vllm", "use_vllm: true, or fewer rows per generation (per_device_train_batch_size x "
                   "steps_per_generation)"),
    "weights": ("model_name_or_path", "a smaller model, a larger card, or an accelerate config that shards the "
                "weights and optimizer (DeepSpeed ZeRO-3 or FSDP)"),
}
TRL_FIELDS["adamw"] = TRL_FIELDS["weights"]


def _check_memory(args, model_name, share, async_trainer: bool, host: Host, gpu_memory, report: Report,
                  processes: int = 1) -> None:
    """Memory per GPU of one TRL process (`engine_memory.trl_phases`)."""
    from .engine_memory import UNKNOWN_FIX, describe, trl_phases

    section = "memory per GPU"
    shape, source = model_shape(model_name)
    if shape is None:
        report.add(section, f"memory unknown: {source}")
        report.refuse("model_name_or_path", f"memory unknown: {source}", UNKNOWN_FIX)
        return
    micro = share.rows // share.unit if share is not None else args.per_device_train_batch_size
    precision = "bf16" if args.bf16 else "fp32"
    vllm = "" if not (async_trainer or getattr(args, "use_vllm", False)) else (
        "server" if async_trainer or getattr(args, "vllm_mode", "") != "colocate" else "colocate")
    sleep = bool(getattr(args, "vllm_enable_sleep_mode", False))
    ckpt = bool(getattr(args, "gradient_checkpointing", False))
    report.add(section, f"{model_name}: {shape.params / 1e9:.3g}B parameters ({source}); {micro} rows per forward, "
                        f"{args.max_completion_length} completion tokens, update in {precision}"
                        + (", activation checkpointing" if ckpt else "") + {
                            "colocate": f"; vLLM colocated{', asleep during the update' if sleep else ''}",
                            "server": "; vLLM on GPUs of its own", "": "; generation through transformers"}[vllm])
    fits = []
    for name, card in target_cards(host, gpu_memory).items():
        ph = trl_phases(shape, card=card, micro_rows=micro, generation_rows=args.per_device_train_batch_size * getattr(
            args, "steps_per_generation", 1), completion=args.max_completion_length, precision=precision,
            checkpointed=ckpt, vllm=vllm, utilization=getattr(args, "vllm_gpu_memory_utilization", 0.0),
            sleep=sleep, processes=processes)
        for line in describe(name, ph):
            report.add(section, line)
        if ph.total <= card:
            fits.append(name)
    term = ph.dominant(card)
    field, fix = TRL_FIELDS[term]
    report.fits(section, fits, field, f"{ph.total / GIB:.1f} GiB per GPU, most of it {memory.TERM_WORDS[term]} "
                f"({micro} rows per forward), more than the {name} card holds ({card / GIB:.1f} GiB)", fix)


def _check_output_dir(args, report: Report, argv: list[str]) -> None:
    out = Path(args.output_dir)
    ckpts = sorted(out.glob(TRL_CHECKPOINT_PREFIX + "*"), key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit() else -1)
    resume = getattr(args, "resume_from_checkpoint", None)
    if resume:
        there = Path(resume).is_dir()
        report.add("checkpoints", f"{out}: RESUMES from {resume}" + ("" if there else " (missing)"))
        if not there:
            report.refuse(as_typed("resume_from_checkpoint", argv), f"{resume} does not exist",
                          "a checkpoint-N folder of the run")
    elif ckpts:
        report.refuse(as_typed("output_dir", argv), f"{out} holds {ckpts[-1].name} of an earlier run, and the script "
                      "starts over "
                      "(resume_from_checkpoint unset), writing its checkpoints among them",
                      f"--resume_from_checkpoint {ckpts[-1]} to continue it, or a new --output_dir")
    else:
        report.add("checkpoints", f"{out}: new run")
