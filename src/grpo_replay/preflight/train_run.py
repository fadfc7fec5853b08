"""The preflight of one `TrainConfig` run (`grpo-replay train`, and each run of `grpo-replay compare`): memory per
phase on its GPU, replay rows per step after the backend's batch mapping, its run directory, its data."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..step_plan import plan_step
from ..trainer import memory
from ..trainer.train_config import TrainConfig
from .host import Host
from .report import Report
from .shapes import model_shape

GIB = 2**30
# Cards a GPU recipe is planned for when the host has none and none is named (nvidia-smi's memory.total).
CARDS = {"80 GB (H100 / A100 80GB)": 81559 * 2**20, "141 GB (H200)": 143771 * 2**20}


def target_cards(host: Host, gpu_memory: Optional[int]) -> dict[str, int]:
    """The card(s) the memory is checked against: the named size, else this host's GPU, else `CARDS`."""
    if gpu_memory:
        return {f"{gpu_memory / GIB:.0f} GiB (--gpu-memory)": gpu_memory}
    if host.gpus:
        return {f"this host's GPU, {host.gpu_memory / GIB:.1f} GiB": host.gpu_memory}
    return dict(CARDS)


def on_gpu(cfg: TrainConfig, host: Host, gpu_memory: Optional[int]) -> bool:
    """Whether the run trains on a GPU: it names one (device=cuda, generator=vllm), or device=auto where there is
    one (this host, or the card named on the command line)."""
    if cfg.device == "cpu":
        return False
    return cfg.device == "cuda" or cfg.generator == "vllm" or bool(host.gpus) or bool(gpu_memory)


def check_memory(cfg: TrainConfig, host: Host, gpu_memory: Optional[int], report: Report, label: str = "") -> None:
    """Memory per phase on the run's GPU (trainer/memory.py's estimate, the one the trainer checks at start)."""
    section, tag = "memory per GPU", f"{label.strip()} " if label else ""
    shape, source = model_shape(cfg.model, cfg.testbed if cfg.model is None else None)
    if shape is None:
        report.add(section, tag + f"not estimated: {source}")
        return
    gpu = on_gpu(cfg, host, gpu_memory)
    precision = memory.precision_of(cfg, "cuda" if gpu else "cpu")
    report.add(section, tag + f"model {cfg.model or 'testbed'}: {shape.params / 1e9:.3g}B parameters, {shape.layers} layers, "
                        f"KV width {shape.kv_heads} x {shape.head_dim} ({source}); update in {precision}")
    if not gpu:
        ph = memory.run_phases(cfg, shape, "cpu")
        report.add(section, tag + f"on the CPU: {(4 * shape.params + ph.need) / GIB:.2f} GiB of host memory at the "
                            f"{ph.peak_phase()} phase")
        return
    fits = []
    for name, card in target_cards(host, gpu_memory).items():
        ph = memory.run_phases(cfg, shape, "cuda", card)
        total = 4 * shape.params + ph.need
        report.add(section, tag + f"{name}: weights {4 * shape.params / GIB:.1f} + AdamW {ph.adamw / GIB:.1f} + vLLM's share "
                            f"{ph.vllm / GIB:.1f} + the largest phase ({ph.peak_phase()}) = {total / GIB:.1f} GiB")
        report.add(section, tag + f"  phases: generation {ph.generation / GIB:.1f}, scoring {ph.scoring / GIB:.1f}, update "
                            f"{ph.update / GIB:.1f}, evaluation {ph.evaluation / GIB:.1f} GiB"
                            + (" (generation and evaluation inside vLLM's share)" if ph.vllm and not ph.evaluation
                               else ""))
        if total <= card:
            fits.append(name)
        last = (name, card, ph)
    name, card, ph = last
    problem, _, fix = memory.refusal(cfg, ph, f"a {name} card has {card / GIB:.1f} GiB").partition("; allowed: ")
    report.fits(section, fits, f"memory{label}", problem, fix, tag)


def check_replay(cfg: TrainConfig, report: Report, label: str = "") -> None:
    """Replay rows per step after the backend's batch mapping (TRL cuts the composed rows to a multiple of
    steps_per_generation) and the realised share against the configured one."""
    section, tag = "replay rows per step", f"{label.strip()} " if label else ""
    rows = cfg.prompts_per_step * cfg.group_size
    if not cfg.replay.enabled:
        report.add(section, tag + f"preset {cfg.preset}: no replay ({rows} fresh rows per step)")
        return
    unit = rows // (cfg.micro_batch_size or rows) if cfg.backend == "trl" else 1
    s = plan_step(rows, cfg.replay, unit, group_size=cfg.group_size)
    mapping = (f"TRL: per_device_train_batch_size={cfg.micro_batch_size or rows}, steps_per_generation={unit}, so "
               f"{s.rows // unit} rows per forward" if cfg.backend == "trl" else "built-in trainer: no trimming")
    report.add(section, tag + f"{s.kept} fresh + {s.planned} replay planned (replay.replay_ratio={cfg.replay.replay_ratio}, "
                        f"{cfg.replay.composition}) -> {s.replay} replay after the mapping ({mapping}); share "
                        f"{s.share:.3f} vs configured {s.configured:.3f} (a full buffer after "
                        f"{cfg.replay.warmup_steps} warm-up steps)")


def check_launch_rules(cfg: TrainConfig, report: Report, label: str = "") -> None:
    """What the command itself refuses before it trains (a ConfigError of the TRL mapping, the data's row count),
    as a refusal naming the key."""
    from ..errors import UsageError
    from ..trainer.setup import check_data_rows

    checks = [check_data_rows] if cfg.reward == "math" else []
    if cfg.backend == "trl":
        from ..trainer.trl import settings as trl_settings

        checks.append(trl_settings.check)
    for check in checks:
        try:
            check(cfg)
        except UsageError as e:
            report.refuse_error(e, label)


def check_run_dir(cfg: TrainConfig, report: Report, label: str = "") -> None:
    """The run directory, and what a launch would do with what is there (new run, resume, or refusal)."""
    from ..errors import UsageError
    from ..trainer.rundir import RunDir, _check_resume, holds_run

    run_dir = cfg.run_dir
    section, tag = "checkpoints", f"{label.strip()} " if label else ""
    if not run_dir.exists():
        report.add(section, tag + f"{run_dir}: new run (the folder does not exist)")
        return
    if not holds_run(run_dir) and any(run_dir.iterdir()):
        report.refuse(f"out_dir{label}", f"{run_dir} holds files grpo-replay did not make", "a new --out directory")
        return
    try:
        done = _check_resume(cfg, RunDir(run_dir))
    except UsageError as e:
        report.refuse(f"out_dir{label}", str(e).split("\n")[0], "a new --out directory, or the run's own config")
        return
    past = RunDir(run_dir).history()
    if done == 0:
        report.add(section, tag + f"{run_dir}: new run (the folder holds no results)")
    elif done >= cfg.steps:
        report.add(section, tag + f"{run_dir}: already finished ({done} steps): the launch trains nothing")
    else:
        report.add(section, tag + f"{run_dir}: RESUMES from step {past.resumable} of {cfg.steps}")


def check_data(cfg: TrainConfig, report: Report, label: str = "") -> None:
    """Training and held-out prompts: a local file that is there, a generated task, or a hub dataset the run loads."""
    section, tag = "data", f"{label.strip()} " if label else ""
    if cfg.reward == "testbed":
        report.add(section, tag + "the embedded testbed (generated; nothing to download)")
        return
    from ..tasks.word_sums import is_word_sums

    for key in ("data", "heldout_data"):
        value = getattr(cfg, key)
        if value is None:
            if key == "heldout_data":
                report.add(section, tag + f"heldout_data: the last eval_problems={cfg.eval_problems} rows of data")
            continue
        if is_word_sums(value):
            report.add(section, tag + f"{key}: {value} (generated)")
        elif Path(value).exists():
            report.add(section, tag + f"{key}: {value} (there)")
        elif "/" in value and not Path(value).parent.exists() and not value.startswith((".", "/", "~", "$")):
            report.add(section, tag + f"{key}: {value}: a Hugging Face dataset, loaded when the run starts (needs the hub "
                                "or a local cache)")
        else:
            report.refuse(f"{key}{label}", f"{value} does not exist",
                          "build it (docs/paper_table.md: the data) or point the key at the file")


def check_train(cfg: TrainConfig, host: Host, gpu_memory: Optional[int], report: Report, label: str = "",
                stack: bool = True) -> None:
    """Every section for one run."""
    if stack and on_gpu(cfg, host, gpu_memory):
        from .host import check_stack

        check_stack(host, "main", True, 1, report)
    elif stack:
        report.add("software", f"torch {host.torch} (installed here); the run uses the CPU")
    check_memory(cfg, host, gpu_memory, report, label)
    check_replay(cfg, report, label)
    check_launch_rules(cfg, report, label)
    from ..trainer.lifecycle import EVAL_SEED_OFFSET

    report.add("seeds", f"{label.strip() + ' ' if label else ''}seed {cfg.seed} (prompt order, sampling, buffer; evaluation sampling seed "
                                f"{cfg.seed + EVAL_SEED_OFFSET})")
    check_run_dir(cfg, report, label)
    check_data(cfg, report, label)
