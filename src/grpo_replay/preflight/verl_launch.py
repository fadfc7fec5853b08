"""The preflight of a verl launcher (examples/verl/*.sh): `[VAR=VALUE ...] bash SCRIPT.sh [overrides]`.

The script is run by bash as the user would run it, with a `python` first on PATH that records the arguments of
`python -m grpo_replay.integrations.verl.main` instead of starting verl (any other python call runs the real one):
so the overrides are exactly what the script passes, after its own variables and arithmetic. Where verl is
installed (the verl environment), the config is also composed by Hydra as the entry point composes it and put
through the entry point's own `check_config`; elsewhere the report reads the overrides and the replay preset.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from ..step_plan import plan_step
from ..trainer import memory
from .host import Host, check_stack
from .report import Report
from .shapes import model_shape
from .train_run import GIB, target_cards

ENTRY = "grpo_replay.integrations.verl.main"
SHIM = """#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "{entry}" ]; then
  printf '%s\\0' "${{@:3}}" > "$GRPO_REPLAY_PREFLIGHT_CAPTURE"; exit 0
fi
exec "{python}" "$@"
"""
# verl 0.9.1's defaults for the keys the report reads when the launch does not set them (its ppo_trainer.yaml).
VERL_DEFAULTS = {"data.seed": "null", "actor_rollout_ref.rollout.seed": "42", "trainer.resume_mode": "auto",
                 "trainer.project_name": "verl_examples", "trainer.default_local_dir":
                 "checkpoints/${trainer.project_name}/${trainer.experiment_name}", "trainer.nnodes": "1"}


def captured_overrides(launch: list[str], timeout: float = 60) -> list[str]:
    """The arguments the launcher passes to the verl entry point (`launch`: optional VAR=VALUE words, then
    `bash SCRIPT [args]`)."""
    env = dict(os.environ)
    words = list(launch)
    while words and "=" in words[0] and not words[0].startswith("-") and words[0].split("=")[0].isidentifier():
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("python", "python3"):
            shim = Path(tmp) / name
            shim.write_text(SHIM.format(entry=ENTRY, python=sys.executable))
            shim.chmod(0o755)
        capture = Path(tmp) / "argv"
        env.update(PATH=f"{tmp}:{env.get('PATH', '')}", GRPO_REPLAY_PREFLIGHT_CAPTURE=str(capture))
        proc = subprocess.run(words, env=env, capture_output=True, text=True, timeout=timeout)
        if not capture.exists():
            from ..errors import UsageError

            raise UsageError(f"{' '.join(words[:2])} did not reach `python -m {ENTRY}` (exit {proc.returncode}): "
                             f"{(proc.stderr or proc.stdout).strip()[-500:]}")
        return [a for a in capture.read_text().split("\0") if a]


def overrides_dict(overrides: list[str]) -> dict[str, str]:
    """Hydra `key=value` overrides (`+key=` / `++key=` too; a later one wins, as in Hydra)."""
    out = {}
    for o in overrides:
        key, _, value = o.partition("=")
        out[key.lstrip("+")] = value.strip("'\"")
    return out


def check_verl_launch(launch: list[str], host: Host, gpu_memory: Optional[int]) -> Report:
    return check_verl_overrides(captured_overrides(launch), host, gpu_memory, " ".join(launch))


def check_verl_overrides(overrides: list[str], host: Host, gpu_memory: Optional[int], launch: str) -> Report:
    """The report of the verl entry point called with `overrides`."""
    report = Report(launch)
    ov = overrides_dict(overrides)
    config = _compose(ov, report)

    def get(key):  # the composed config's value where verl is installed, else the override or verl's default
        if config is not None:
            from omegaconf import OmegaConf

            return str(OmegaConf.select(config, key))
        return ov.get(key, VERL_DEFAULTS.get(key))
    nodes, per_node = int(get("trainer.nnodes")), int(ov.get("trainer.n_gpus_per_node", 8))
    check_stack(host, "verl", True, per_node, report)
    report.add("processes", f"{nodes} node(s) x {per_node} GPU(s) (trainer.nnodes, trainer.n_gpus_per_node)")
    _check_share(ov, nodes * per_node, report)
    _check_memory(ov, nodes * per_node, host, gpu_memory, report)
    _check_seeds(ov, get, report)
    _check_folder(ov, get, report)
    for key in ("data.train_files", "data.val_files"):
        if key in ov:
            there = Path(ov[key]).exists()
            report.add("data", f"{key}: {ov[key]} ({'there' if there else 'MISSING'})")
            if not there:
                report.refuse(key, f"{ov[key]} does not exist", "DATA=<folder with train.parquet and test.parquet> "
                              "(verl's examples/data_preprocess/math_dataset.py writes them)")
    return report


def _compose(ov: dict, report: Report):
    """Hydra's composition and the entry point's own check, where verl is installed: the config, or None."""
    import importlib.util

    if importlib.util.find_spec("verl") is None:
        report.add("config", "verl is not installed here: the overrides are read as the launcher passes them; run "
                             "the preflight in the verl environment for the entry point's own config check")
        return None
    from hydra import compose, initialize_config_module

    from ..integrations.verl.main import check_config

    with initialize_config_module("grpo_replay.integrations.verl.config", version_base=None):
        config = compose("replay_ppo_trainer", overrides=[f"{k}={v}" for k, v in ov.items()])
    try:
        check_config(config)
        report.add("config", "composed by Hydra and accepted by the entry point's check_config")
    except ValueError as e:
        report.refuse_error(e)
    return config


def _replay_config(ov: dict):
    from ..config import ReplayConfig

    import yaml

    preset = ov.get("replay", "paper")
    path = Path(__file__).resolve().parents[1] / "integrations" / "verl" / "config" / "replay" / f"{preset}.yaml"
    values = yaml.safe_load(path.read_text())
    fields = set(ReplayConfig.__dataclass_fields__) - {"seed"}
    values.update({k.split(".", 1)[1]: yaml.safe_load(v) for k, v in ov.items() if k.startswith("replay.")})
    return ReplayConfig(**{k: v for k, v in values.items() if k in fields}), values


def _check_share(ov: dict, gpus: int, report: Report):
    import math

    from ..errors import UsageError

    try:
        cfg, values = _replay_config(ov)
    except UsageError as e:
        if not any(r.field.startswith("ReplayConfig") or "replay" in r.field for r in report.refusals):
            report.refuse_error(e)
        return None
    n = int(ov.get("actor_rollout_ref.rollout.n", 1))
    rows = int(ov.get("data.train_batch_size", 0)) * n
    if not rows:
        return None
    mb = int(ov.get("actor_rollout_ref.actor.ppo_mini_batch_size", rows // n)) * n
    dynamic = ov.get("actor_rollout_ref.actor.use_dynamic_bsz", "false").lower() == "true"
    micro = 1 if dynamic else int(ov.get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 1))
    unit = (rows // mb) * math.lcm(n, gpus * micro) if values.get("keep_optimizer_steps", True) else mb
    s = plan_step(rows, cfg, unit, group_size=n)
    report.add("replay rows per step", f"{s.kept} fresh + {s.planned} replay planned (replay={ov.get('replay', 'paper')})"
                                       f" -> {s.replay} after fitting to verl's unit of {unit} rows (dp {gpus}, "
                                       f"mini-batch {mb}); share {s.share:.3f} vs configured {s.configured:.3f} with no "
                                       "zero-variance group (filtered groups change the count; the fit moves < "
                                       "one unit)")
    if not s.realised:
        report.refuse("data.train_batch_size", f"the composed rows are trimmed to {s.replay} of {s.planned} replay",
                      "a batch whose replay rows are a multiple of the unit")
    return s


def _check_memory(ov: dict, gpus: int, host: Host, gpu_memory, report: Report) -> None:
    """FSDP shards the float32 weights, gradients and AdamW state over the GPUs; vLLM takes its share; a
    micro-batch of ppo_max_token_len_per_gpu tokens (dynamic batch size) with activation checkpointing."""
    section = "memory per GPU"
    shape, source = model_shape(ov.get("actor_rollout_ref.model.path"))
    if shape is None:
        report.add(section, f"not estimated: {source}")
        return
    tokens = int(ov.get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 16384))
    ckpt = ov.get("actor_rollout_ref.model.enable_gradient_checkpointing", "false").lower() == "true"
    share = float(ov.get("actor_rollout_ref.rollout.gpu_memory_utilization", 0.5))
    per_token = shape.kept_per_token("bf16", ckpt)
    sharded = 16 * shape.params // gpus
    fits = []
    for name, card in target_cards(host, gpu_memory).items():
        total = sharded + int(share * card) + tokens * per_token
        report.add(section, f"{name}: weights, gradients and AdamW sharded {sharded / GIB:.1f} + vLLM's share "
                            f"{share * card / GIB:.1f} + a micro-batch of {tokens} tokens {tokens * per_token / GIB:.1f}"
                            f" = {total / GIB:.1f} GiB ({source})")
        if total <= card:
            fits.append(name)
    report.fits(section, fits, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "the update's micro-batch does "
                "not fit", "fewer tokens per GPU, gradient checkpointing, or a lower rollout.gpu_memory_utilization")


def _check_seeds(ov: dict, get, report: Report) -> None:
    seeds = {k: get(k) for k in ("replay.seed", "data.seed", "actor_rollout_ref.rollout.seed")}
    if seeds["replay.seed"] in (None, "None"):  # not composed: the replay group's own default
        seeds["replay.seed"] = ov.get("replay.seed", 0)
    report.add("seeds", ", ".join(f"{k}={v}" for k, v in seeds.items()))
    if "replay.seed" in ov and str(get("data.seed")) in ("null", "None", ""):
        report.refuse("data.seed", "the launch sets replay.seed but not data.seed: every seed sees one prompt order "
                      f"and rollout seed {get('actor_rollout_ref.rollout.seed')}, so seeds repeat one run",
                      "set data.seed and actor_rollout_ref.rollout.seed with replay.seed (one value per seed)")


def _check_folder(ov: dict, get, report: Report) -> None:
    exp = get("trainer.experiment_name") or ""
    folder = str(get("trainer.default_local_dir")).replace("${trainer.project_name}", str(get("trainer.project_name")))
    folder = folder.replace("${trainer.experiment_name}", exp)
    steps = sorted((p for p in Path(folder).glob("global_step_*") if p.name.split("_")[-1].isdigit()),
                   key=lambda p: int(p.name.split("_")[-1]))
    resume = get("trainer.resume_mode")
    if exp and exp not in folder:
        report.refuse("trainer.default_local_dir", f"{folder} does not name the run (experiment {exp}): every arm and "
                      f"seed launched with it shares the folder, and resume_mode={resume} loads the latest "
                      "global_step_* another run wrote", "a folder per run, e.g. .../$EXP")
    if steps and resume == "auto":
        report.add("checkpoints", f"{folder}: RESUMES from {steps[-1].name} (resume_mode auto)")
    else:
        report.add("checkpoints", f"{folder}: new run")
