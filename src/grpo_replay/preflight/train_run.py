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
    """Memory per phase on the run's GPU (trainer/memory.py's estimate, the one the trainer checks at start). A run
    with device=auto on a host without a GPU is planned for the target cards too: on a GPU host it trains there."""
    from .engine_memory import UNKNOWN_FIX, describe

    section, tag = "memory per GPU", f"{label.strip()} " if label else ""
    shape, source = model_shape(cfg.model, cfg.testbed if cfg.model is None else None)
    if shape is None:
        report.add(section, tag + f"memory unknown: {source}")
        report.refuse(f"--model{label}", f"memory unknown: {source}", UNKNOWN_FIX)
        return
    gpu = on_gpu(cfg, host, gpu_memory)
    precision = memory.precision_of(cfg, "cuda" if gpu or cfg.device == "auto" else "cpu")
    report.add(section, tag + f"model {cfg.model or 'testbed'}: {shape.params / 1e9:.3g}B parameters, {shape.layers} layers, "
                        f"KV width {shape.kv_heads} x {shape.head_dim} ({source}); update in {precision}")
    if not gpu:
        ph = memory.run_phases(cfg, shape, "cpu")
        report.add(section, tag + f"on this host's CPU: {ph.total / GIB:.2f} GiB of host memory at the "
                            f"{ph.peak_phase()} phase")
        if cfg.device == "cpu":  # the trainer's own check at start (trainer/memory.check_step_memory)
            import torch

            have = memory._available_bytes(torch.device("cpu"))
            if have is not None and ph.need > have:
                problem, _, fix = memory.refusal(cfg, ph, f"this host has {have / GIB:.1f} GiB available").partition(
                    "; allowed: ")
                report.refuse(f"{memory.FIELD_OF_TERM[ph.dominant()]}{label}", problem, fix)
            return
        report.add(section, tag + "device=auto: on a host with a GPU the run trains there, so it is planned for these "
                            "cards (--set device=cpu plans a CPU run)")
    fits = []
    for name, card in target_cards(host, gpu_memory).items():
        ph = memory.run_phases(cfg, shape, "cuda", card)
        for line in describe(name, ph):
            report.add(section, tag + line)
        if ph.total <= card:
            fits.append(name)
        last = (name, card, ph)
    name, card, ph = last
    problem, _, fix = memory.refusal(cfg, ph, f"a {name} card has {card / GIB:.1f} GiB", card).partition("; allowed: ")
    report.fits(section, fits, f"{memory.FIELD_OF_TERM[ph.dominant(card)]}{label}", problem, fix, tag)


def check_replay(cfg: TrainConfig, report: Report, label: str = "") -> None:
    """Replay rows per step after the backend's batch mapping (TRL cuts the composed rows to a multiple of
    steps_per_generation) and the realised share against the configured one."""
    section, tag = "replay rows per step", f"{label.strip()} " if label else ""
    rows = cfg.prompts_per_step * cfg.group_size
    if not cfg.replay.enabled:
        report.add(section, tag + f"preset {cfg.preset}: no replay ({rows} fresh rows per step)")
        return
    if cfg.steps <= cfg.replay.warmup_steps:  # the buffer draws nothing before step warmup_steps
        report.add(section, tag + f"no replay in this run: its {cfg.steps} steps are all within replay.warmup_steps="
                                  f"{cfg.replay.warmup_steps} (the buffer draws from step {cfg.replay.warmup_steps} "
                                  f"on), so every step trains {rows} fresh rows: share 0.000 (--steps above "
                                  f"{cfg.replay.warmup_steps} or a lower replay.warmup_steps replays)")
        return
    unit = rows // (cfg.micro_batch_size or rows) if cfg.backend == "trl" else 1
    s = plan_step(rows, cfg.replay, unit, group_size=cfg.group_size)
    mapping = (f"TRL: per_device_train_batch_size={cfg.micro_batch_size or rows}, steps_per_generation={unit}, so "
               f"{s.rows // unit} rows per forward" if cfg.backend == "trl" else "built-in trainer: no trimming")
    report.add(section, tag + f"{s.kept} fresh + {s.planned} replay planned (replay.replay_ratio={cfg.replay.replay_ratio}, "
                        f"{cfg.replay.composition}) -> {s.replay} replay after the mapping ({mapping}); share "
                        f"{s.share:.3f} vs configured {s.configured:.3f} (a full buffer after "
                        f"{cfg.replay.warmup_steps} warm-up steps)")
    report.add(section, tag + f"replay in {cfg.steps - cfg.replay.warmup_steps} of the run's {cfg.steps} steps "
                              f"(from step {cfg.replay.warmup_steps}, after replay.warmup_steps)")


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
    """The run directory, and what a launch would do with what is there (new run, resume, or refusal): the checks
    `train` makes before it starts (`rundir._check_resume`) and when it resumes (`checkpoint.newest_readable`, the
    files its resume reads)."""
    from ..errors import UsageError
    from ..trainer.rundir import RunDir, _check_resume, holds_run

    run_dir = cfg.run_dir
    section, tag, field = "checkpoints", f"{label.strip()} " if label else "", f"--out{label}"
    if not run_dir.exists():
        report.add(section, tag + f"{run_dir}: new run (the folder does not exist)")
        return
    if not holds_run(run_dir) and any(run_dir.iterdir()):
        report.refuse(field, f"{run_dir} holds files grpo-replay did not make", "a new --out directory")
        return
    try:
        done = _check_resume(cfg, RunDir(run_dir))
        resumes = _readable_checkpoint(cfg, run_dir) if 0 < done < cfg.steps else None
    except UsageError as e:
        _refuse_resume(cfg, e, field, report)
        return
    if done == 0:
        report.add(section, tag + f"{run_dir}: new run (the folder holds no results)")
    elif done >= cfg.steps:
        report.add(section, tag + f"{run_dir}: already finished ({done} steps): the launch trains nothing")
    else:
        report.add(section, tag + f"{run_dir}: RESUMES from {resumes} of {cfg.steps} steps")


def _readable_checkpoint(cfg: TrainConfig, run_dir: Path) -> str:
    """The checkpoint `train`'s resume would load (NoUsableCheckpoint when every one is damaged), as a phrase."""
    from ..trainer import checkpoint
    from ..trainer.rundir import RunDir

    if cfg.backend != "builtin":
        return f"step {RunDir(run_dir).history().resumable} (TRL's checkpoint)"
    path, damaged = checkpoint.newest_readable(run_dir, cfg.replay, bool(cfg.drift_probe))
    if path is None:
        return f"step {RunDir(run_dir).history().resumable}"
    skipped = f" (past {len(damaged)} damaged newer: {'; '.join(map(str, damaged))})" if damaged else ""
    return f"{path.name}{skipped}"


def _refuse_resume(cfg: TrainConfig, error: Exception, field: str, report: Report) -> None:
    """A resume `train` refuses: with a changed config, the keys that differ and their values in the run."""
    from ..errors import UsageError
    from ..trainer.rundir import RunDir, config_diff

    try:
        diff = config_diff(RunDir(cfg.run_dir).saved_config(), cfg)
    except UsageError:
        diff = {}
    if not diff:
        from ..trainer.checkpoint import NoUsableCheckpoint

        problem, _, _ = str(error).split("\n")[0].partition(". Nothing can resume")
        report.refuse(field, problem, "delete the damaged ckpt-* folders (the run starts over) or a new --out "
                      "directory" if isinstance(error, NoUsableCheckpoint) else "a new --out directory, or the run's "
                      "own config")
        return
    changes = ", ".join(f"{k}: {old!r} in the run, {new!r} here" for k, (old, new) in diff.items())
    report.refuse(field, f"{cfg.run_dir} holds a run made with another config ({changes}); resuming it would mix two "
                  "runs", "a new --out directory, or the run's own values: "
                  + " ".join(f"--set {k}={old}" for k, (old, _) in diff.items()))


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
        elif Path(value).expanduser().exists():  # as the trainer reads it (`~/data.jsonl` from a config)
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
