"""A verl launch's config and the entry point's own checks on it, for the preflight of a verl launcher.

Where verl is installed (the verl environment), the overrides are composed by Hydra as the entry point composes
them and put through the entry point's own list of checks (`integrations/verl/main.launch_checks`: the replay
group, paths, verl's `validate_config`, the lengths and micro-batches verl breaks on later, the seeds and the
checkpoint folder), without writing the run's record. Elsewhere the overrides are read as the launcher passes
them (`Overrides`), and the report says that the entry point's checks were not run.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from .report import Report

# verl 0.9.1's defaults for the keys the report reads when verl is not installed here (its ppo_trainer.yaml).
VERL_DEFAULTS = {"data.seed": "null", "actor_rollout_ref.rollout.seed": "42", "trainer.resume_mode": "auto",
                 "trainer.project_name": "verl_examples", "trainer.default_local_dir":
                 "checkpoints/${trainer.project_name}/${trainer.experiment_name}", "trainer.nnodes": "1",
                 "trainer.n_gpus_per_node": "8"}


def overrides_dict(overrides: list[str]) -> dict[str, str]:
    """Hydra `key=value` overrides (`+key=` / `++key=` too; a later one wins, as in Hydra)."""
    out = {}
    for o in overrides:
        key, _, value = o.partition("=")
        out[key.lstrip("+")] = value.strip("'\"")
    return out


def hydra_list(value: str) -> list[str]:
    """The paths of a Hydra value: `a.parquet`, or the list form `[a.parquet,b.parquet]` (quotes dropped)."""
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        return [v.strip().strip("'\"") for v in value[1:-1].split(",") if v.strip()]
    return [value]


def compose(overrides: list[str]):
    """verl's config as the entry point composes it, or None where verl is not installed here; ValueError naming
    the override when Hydra cannot compose it."""
    import importlib.util

    if importlib.util.find_spec("verl") is None or importlib.util.find_spec("hydra") is None:
        return None
    from hydra import compose as hydra_compose, initialize_config_module
    from hydra.errors import HydraException

    try:
        with initialize_config_module("grpo_replay.integrations.verl.config", version_base=None):
            return hydra_compose("replay_ppo_trainer", overrides=list(overrides))
    except HydraException as e:  # what the entry point's Hydra would stop on, before any check
        lines = str(e).splitlines()
        key = re.search(r"'([\w.+/]+)'", lines[0])
        field = key.group(1).split("/")[0] if key else "launch"
        if field.startswith("replay."):
            from ..integrations.verl.settings import CONFIG_FIELDS, SETTINGS_FIELDS

            allowed = "the replay group's keys: " + ", ".join(f"replay.{k}" for k in CONFIG_FIELDS + SETTINGS_FIELDS)
        else:
            allowed = ("the keys of verl's ppo_trainer config and the replay group (replay=paper|grpo|uniform_pool|"
                       "sigma_pool), in Hydra's override syntax")
        raise ValueError(f"{field}: Hydra cannot compose the launch ({' '.join(lines[:2])}); allowed: {allowed}") \
            from None


def refuse(report: Report, error: Exception) -> None:
    """A refusal from the entry point's ValueError: its messages begin with the override they name
    (`key=value: ...` or `key: ...`; a replay setting as `ReplayConfig.key`) and end with `; allowed: ...`."""
    message = " ".join(str(error).split())
    unknown = re.match(r"unknown replay config keys \['([\w.]+)'", message)
    key = re.match(r"([A-Za-z_][\w.]*)", message)
    field = f"replay.{unknown.group(1)}" if unknown else key.group(1) if key else "launch"
    field = re.sub(r"^ReplayConfig\.", "replay.", field).rstrip(".")
    problem, _, fix = message.partition("; allowed: ")
    if not any((r.field, r.problem) == (field, problem) for r in report.refusals):  # several checks read one key
        report.refuse(field, problem, fix or "see the problem")


def entry_point_checks(config, report: Report) -> None:
    """The entry point's checks (`launch_checks`) on the composed config, each refusal with its field; nothing
    written, and Ray's CPUs only as the config states them (this host is not the one that launches)."""
    from ..integrations.verl.limits import update_tokens_per_gpu
    from ..integrations.verl.main import launch_checks

    passed = True
    for check in launch_checks(config, write=False, this_machine=False):
        try:
            line = check()
        except ValueError as e:
            refuse(report, e)
            passed = False
            continue
        if line and line.startswith("checkpoints: "):
            report.add("checkpoints", line.split(": ", 1)[1])
        elif line:
            report.add("config", line)
    if passed:
        report.add("config", "composed by Hydra and accepted by the entry point's checks (launch_checks: the replay "
                             "group, paths, verl's validate_config, lengths and micro-batches, seeds, checkpoints)")
    try:
        tokens, how = update_tokens_per_gpu(config)
        report.add("update micro-batch", f"{tokens} tokens per GPU at most ({how})")
    except (TypeError, ValueError):
        pass  # a batch setting the checks above refused


class Overrides:
    """The launch's values where verl is not installed here: the override as passed, else verl's default."""

    def __init__(self, ov: dict[str, str]):
        self.ov = ov

    def get(self, key: str) -> Optional[str]:
        return self.ov.get(key, VERL_DEFAULTS.get(key))

    def folder(self) -> str:
        folder = str(self.get("trainer.default_local_dir"))
        for key in ("trainer.project_name", "trainer.experiment_name"):
            folder = folder.replace("${" + key + "}", str(self.get(key) or ""))
        return folder

    def check(self, report: Report) -> None:
        """What can be read without verl: the seeds, the checkpoint folder and the data files."""
        report.add("config", "verl is not installed here: the overrides are read as the launcher passes them, and "
                             "the entry point's checks (verl's validate_config, lengths, the run-folder record) are "
                             "not run; run the preflight in the verl environment for them")
        seeds = {k: self.get(k) for k in ("replay.seed", "data.seed", "actor_rollout_ref.rollout.seed")}
        seeds["replay.seed"] = seeds["replay.seed"] or "0"
        report.add("seeds", ", ".join(f"{k}={v}" for k, v in seeds.items()))
        if seeds["replay.seed"] != "0" and seeds["data.seed"] in ("null", "None", "", "0"):
            report.refuse("data.seed", f"the launch sets replay.seed={seeds['replay.seed']} but not data.seed: every "
                          f"seed sees one prompt order and rollout seed {seeds['actor_rollout_ref.rollout.seed']}, "
                          "so the GRPO arm repeats one run", "set data.seed and actor_rollout_ref.rollout.seed with "
                          "replay.seed (one value per seed; the launchers' SEED=N sets them all)")
        latest = Path(self.folder()) / "latest_checkpointed_iteration.txt"
        if latest.is_file() and self.get("trainer.resume_mode") == "auto":
            report.add("checkpoints", f"{self.folder()}: holds global_step_{latest.read_text().strip()}; the entry "
                                      "point resumes it if its record (grpo_replay_run.json) is this run's, and "
                                      "refuses it otherwise (not checked here)")
        else:
            report.add("checkpoints", f"{self.folder()}: new run")
        for key in ("data.train_files", "data.val_files"):
            for path in hydra_list(self.ov[key]) if key in self.ov else []:
                there = Path(path).expanduser().exists() or "://" in path
                report.add("data", f"{key}: {path} ({'there' if there else 'MISSING'})")
                if not there:
                    report.refuse(key, f"{path} does not exist", "DATA=<folder with train.parquet and test.parquet> "
                                  "(verl's examples/data_preprocess/math_dataset.py writes them)")


def values(config: Any, ov: dict[str, str]):
    """`get(key)`: the composed config's value where there is one, else the launch's override or verl's default."""
    if config is None:
        return Overrides(ov).get

    def get(key: str) -> Optional[str]:
        from omegaconf import OmegaConf

        value = OmegaConf.select(config, key)
        return None if value is None else str(value)
    return get
