"""The preflight of a verl launcher (examples/verl/*.sh): `[VAR=VALUE ...] bash SCRIPT.sh [overrides]`.

The script is run by bash as the user would run it, with a `python` first on PATH that records the arguments of
`python -m grpo_replay.integrations.verl.main` instead of starting verl (any other python call runs the real one):
so the overrides are exactly what the script passes, after its own variables and arithmetic. Nothing of the
script is left running: it runs in a process group of its own, killed when the script ends or runs past the time
limit. Where verl is installed (the verl environment), the config is composed and put through the entry point's
own checks (`verl_config`); elsewhere the launch's own python does that where it has verl (`verl_elsewhere`), and
otherwise the report reads the overrides and the replay preset and says the entry point's checks were not run.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
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
from .verl_config import Overrides, compose, entry_point_checks, hydra_list, overrides_dict, refuse, values
from .verl_elsewhere import MARK, can_compose_here, run_there

ENTRY = "grpo_replay.integrations.verl.main"
# The recording python: the entry point's arguments, and the python the launch would have run it with (the next
# `python` on its PATH, without this folder).
SHIM = """#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "{entry}" ]; then
  printf '%s\\0' "${{@:3}}" > "$GRPO_REPLAY_PREFLIGHT_CAPTURE"
  shims="{shims}"; rest=":$PATH:"; rest="${{rest//":$shims:"/:}}"; rest="${{rest#:}}"
  PATH="${{rest%:}}" command -v python > "$GRPO_REPLAY_PREFLIGHT_CAPTURE.python" || true
  exit 0
fi
exec "{python}" "$@"
"""


def captured_overrides(launch: list[str], timeout: float = 60) -> list[str]:
    """The arguments the launcher passes to the verl entry point (`launch`: optional VAR=VALUE words, then
    `bash SCRIPT [args]`). UsageError when it does not reach the entry point, or not within `timeout` seconds."""
    return captured_launch(launch, timeout)[0]


def captured_launch(launch: list[str], timeout: float = 60) -> tuple[list[str], Optional[str]]:
    """(`captured_overrides`, the python the launcher would have run the entry point with, or None)."""
    from ..errors import UsageError

    env = dict(os.environ)
    words = list(launch)
    while words and "=" in words[0] and not words[0].startswith("-") and words[0].split("=")[0].isidentifier():
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    script = " ".join(words[:2])
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("python", "python3"):
            shim = Path(tmp) / name
            shim.write_text(SHIM.format(entry=ENTRY, python=sys.executable, shims=tmp))
            shim.chmod(0o755)
        capture, log = Path(tmp) / "argv", Path(tmp) / "log"
        env.update(PATH=f"{tmp}:{env.get('PATH', '')}", GRPO_REPLAY_PREFLIGHT_CAPTURE=str(capture))
        code = _run_alone(words, env, log, timeout, script)
        if code is None:
            raise UsageError(f"{script}: did not reach `python -m {ENTRY}` within {timeout:g} s (stopped, with "
                             "everything it started); allowed: a launcher that calls the entry point without waiting "
                             "first (a download, a GPU check or a server before it holds the preflight)")
        if not capture.exists():
            raise UsageError(f"{script} did not reach `python -m {ENTRY}` (exit {code}): "
                             f"{log.read_text(errors='replace').strip()[-500:]}")
        python = Path(f"{capture}.python")
        return ([a for a in capture.read_text().split("\0") if a],
                python.read_text().strip() or None if python.is_file() else None)


def _run_alone(words: list[str], env: dict, log: Path, timeout: float, script: str) -> Optional[int]:
    """Run the launcher in a process group of its own, its output to `log` (a file, not a pipe, which a
    background child would hold open); its exit status, or None past `timeout`. Either way the whole group is
    stopped after it: nothing the script started keeps running."""
    from ..errors import UsageError

    try:
        with open(log, "w") as out:
            proc = subprocess.Popen(words, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
    except OSError as e:
        raise UsageError(f"{script}: cannot run it ({e.strerror or e}); allowed: a launcher that exists, e.g. "
                         "bash examples/verl/run_paper_single_node.sh") from None
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def check_verl_launch(launch: list[str], host: Host, gpu_memory: Optional[int]) -> Report:
    """The launch's report: computed here where verl is installed, else by the launch's own python where it has
    verl (`verl_elsewhere`), else from the overrides as passed."""
    overrides, python = captured_launch(launch)
    there = None if can_compose_here() else run_there(python, overrides, host, gpu_memory, " ".join(launch))
    return there or check_verl_overrides(overrides, host, gpu_memory, " ".join(launch))


def check_verl_overrides(overrides: list[str], host: Host, gpu_memory: Optional[int], launch: str) -> Report:
    """The report of the verl entry point called with `overrides`."""
    report = Report(launch)
    ov = overrides_dict(overrides)
    try:
        config = compose(overrides)
    except ValueError as e:
        refuse(report, e)
        return report
    get = values(config, ov)
    nodes, per_node = int(get("trainer.nnodes")), int(get("trainer.n_gpus_per_node"))
    check_stack(host, "verl", True, per_node, report)
    report.add("processes", f"{nodes} node(s) x {per_node} GPU(s) (trainer.nnodes, trainer.n_gpus_per_node)")
    _check_share(ov, nodes * per_node, report)
    _check_memory(ov, nodes * per_node, host, gpu_memory, report)
    if config is None:
        Overrides(ov).check(report)
    else:
        report.add("seeds", ", ".join(f"{k}={get(k)}" for k in SEEDS))
        for key in ("data.train_files", "data.val_files"):
            report.add("data", f"{key}: {', '.join(hydra_list(get(key) or 'unset'))}")
        entry_point_checks(config, report)
    _check_folder_names_run(get, report)
    return report


SEEDS = ("replay.seed", "data.seed", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.actor.data_loader_seed")


def _replay_config(ov: dict):
    from ..config import ReplayConfig

    import yaml

    preset = ov.get("replay", "paper")
    path = Path(__file__).resolve().parents[1] / "integrations" / "verl" / "config" / "replay" / f"{preset}.yaml"
    if not path.is_file():
        from ..errors import UsageError

        presets = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise UsageError(f"replay={preset} is not a preset of the replay group; allowed: {', '.join(presets)}")
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
            refuse(report, e)
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


# The override to change first, by the term that dominates (`Phases.dominant`), and the fix.
VERL_FIELDS = {
    "vllm": ("actor_rollout_ref.rollout.gpu_memory_utilization", "a lower rollout.gpu_memory_utilization (vLLM's KV "
             "cache), or rollout.free_cache_engine=true (vLLM sleeps during the update)"),
    "update": ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "fewer tokens per GPU (ppo_max_token_len_per_gpu, "
               "or ppo_micro_batch_size_per_gpu without use_dynamic_bsz), or gradient checkpointing"),
    "scoring": ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "fewer tokens per GPU in the log-prob "
                "pass (log_prob_max_token_len_per_gpu, or log_prob_micro_batch_size_per_gpu)"),
    "weights": ("trainer.n_gpus_per_node", "more GPUs to shard over (trainer.n_gpus_per_node, trainer.nnodes), or a "
                "larger card"),
}
VERL_FIELDS["adamw"] = VERL_FIELDS["weights"]


def _tokens(ov: dict, dynamic_key: str, max_key: str, micro_key: str, default_max: int) -> int:
    """Tokens of one micro-batch: the dynamic cap, or micro rows x (max prompt + max response)."""
    if ov.get(dynamic_key, "false").lower() == "true":
        return int(ov.get(max_key, default_max))
    rows = int(ov.get(micro_key) or 1)
    return rows * (int(ov.get("data.max_prompt_length", 512)) + int(ov.get("data.max_response_length", 512)))


def _check_memory(ov: dict, gpus: int, host: Host, gpu_memory, report: Report) -> None:
    """Memory per actor GPU (`engine_memory.verl_phases`): FSDP shards over the actor's GPUs, vLLM's share where the
    rollout is colocated (asleep during the update with free_cache_engine), one micro-batch's tokens."""
    from .engine_memory import UNKNOWN_FIX, describe, verl_phases

    section, a = "memory per GPU", "actor_rollout_ref."
    shape, source = model_shape(ov.get(a + "model.path"))
    if shape is None:
        report.add(section, f"memory unknown: {source}")
        report.refuse(a + "model.path", f"memory unknown: {source}", UNKNOWN_FIX)
        return
    tokens = _tokens(ov, a + "actor.use_dynamic_bsz", a + "actor.ppo_max_token_len_per_gpu",
                     a + "actor.ppo_micro_batch_size_per_gpu", 16384)
    logprob = _tokens(ov, a + "rollout.log_prob_use_dynamic_bsz", a + "rollout.log_prob_max_token_len_per_gpu",
                      a + "rollout.log_prob_micro_batch_size_per_gpu",
                      int(ov.get(a + "actor.ppo_max_token_len_per_gpu", 16384)))
    ckpt = ov.get(a + "model.enable_gradient_checkpointing", "false").lower() == "true"
    mode = ov.get("trainer.v1.trainer_mode", "sync") if ov.get("trainer.use_v1", "true").lower() == "true" else "legacy"
    colocated = mode != "separate_async" and ov.get(a + "hybrid_engine", "true").lower() == "true"
    asleep = ov.get(a + "rollout.free_cache_engine", "true").lower() == "true"
    share = float(ov.get(a + "rollout.gpu_memory_utilization", 0.5))
    rollout = ("rollout on GPUs of its own" if not colocated else "vLLM colocated, " + (
        "asleep during the update (free_cache_engine)" if asleep else "awake during the update"))
    report.add(section, f"{ov.get(a + 'model.path')}: {shape.params / 1e9:.3g}B parameters ({source}); FSDP over "
                        f"{gpus} GPUs, bf16 compute; a micro-batch of {tokens} tokens in the update, {logprob} in the "
                        f"log-prob pass; trainer {mode}: {rollout}")
    fits = []
    for name, card in target_cards(host, gpu_memory).items():
        ph = verl_phases(shape, card=card, shards=gpus, tokens=tokens, logprob_tokens=logprob, checkpointed=ckpt,
                         utilization=share, colocated=colocated, asleep=asleep)
        for line in describe(name, ph):
            report.add(section, line)
        if ph.total <= card:
            fits.append(name)
    term = ph.dominant(card)
    field, fix = VERL_FIELDS.get(term, VERL_FIELDS["update"])
    report.fits(section, fits, field, f"{ph.total / GIB:.1f} GiB per GPU, most of it {memory.TERM_WORDS[term]}, more "
                f"than the {name} card holds ({card / GIB:.1f} GiB)", fix)


def _check_folder_names_run(get, report: Report) -> None:
    """A checkpoint folder that does not name its run is shared by every arm and seed launched with it."""
    exp = get("trainer.experiment_name") or ""
    folder = str(get("trainer.default_local_dir")).replace("${trainer.project_name}", str(get("trainer.project_name")))
    folder = folder.replace("${trainer.experiment_name}", exp)
    if exp and exp not in folder:
        report.refuse("trainer.default_local_dir", f"{folder} does not name the run (experiment {exp}): every arm and "
                      f"seed launched with it shares the folder, and resume_mode={get('trainer.resume_mode')} loads "
                      "the latest global_step_* another run wrote", "a folder per run, e.g. .../$EXP")


def report_for_caller() -> None:
    """In the launch's python: the report of the overrides on stdin's host (its GPUs as given; its software as
    installed here), one JSON line after `MARK`: the child side of `verl_elsewhere.run_there`."""
    import importlib.metadata

    if not can_compose_here():
        sys.exit(3)
    data = json.loads(sys.stdin.read())
    mine = Host.detect()
    host = dataclasses.replace(Host(**data["host"]), torch=mine.torch, torch_cuda=mine.torch_cuda, vllm=mine.vllm)
    report = check_verl_overrides(data["overrides"], host, data["gpu_memory"], data["launch"])
    print(MARK + json.dumps({"sections": report.sections, "verl": importlib.metadata.version("verl"),
                             "refusals": [[r.field, r.problem, r.fix] for r in report.refusals]}), flush=True)
