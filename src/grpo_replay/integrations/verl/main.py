"""Entry point: `python -m grpo_replay.integrations.verl.main [hydra overrides]`.

The same as `python -m verl.trainer.main_ppo` with the config `replay_ppo_trainer` (verl's `ppo_trainer` plus the
`replay` group) and a replay task runner: verl's v1 trainer by default (`trainer.use_v1=true`, `ReplayTaskRunnerV1`),
the legacy `RayPPOTrainer` with `trainer.use_v1=false` (`ReplayTaskRunner`). Pick a preset with
`replay=paper|grpo|uniform_pool|sigma_pool` and override fields with `replay.tau_max=5` etc. A bad replay setting or
an unsupported `trainer.v1.trainer_mode`, a configuration replay cannot run, a missing local path or too few CPUs
for TransferQueue, what verl's own `validate_config` refuses, a length or micro-batch verl would break on later
(`limits.py`), a seed loop over `replay.seed` alone (`seeds.py`) or a checkpoint folder another run wrote
(`run_folder.py`) is refused with exit status 2 before Ray starts; the launch says whether it resumes a
checkpoint. `launch_checks` is that list, in order: `grpo-replay preflight` runs the same list on the composed
config (without writing the run's record).
"""
from __future__ import annotations

import sys
from typing import Callable, Optional

import hydra

from .settings import split_config


def check_config(config) -> type:
    """Validate what grpo-replay adds to the config (ValueError naming the field) and return the task runner class
    to use. The config alone decides: `check_environment` checks this machine's paths and CPUs."""
    from omegaconf import OmegaConf

    split_config(OmegaConf.to_container(config.replay, resolve=True))
    if config.trainer.get("use_v1", True):
        from .runner_v1 import ReplayTaskRunnerV1
        from .trainer_v1 import replay_trainer_cls
        from .v1_checks import check_config as check_v1

        replay_trainer_cls(config.trainer.v1.trainer_mode)
        check_v1(config)
        return ReplayTaskRunnerV1
    from .legacy.checks import check_config as check_legacy
    from .legacy.runner import ReplayTaskRunner

    check_legacy(config)
    return ReplayTaskRunner


def check_environment(config, ray_cpus: Optional[float] = None, this_machine: bool = True) -> Optional[str]:
    """What this launch needs from the machine, before Ray starts (ValueError naming the field): local model and
    data paths exist and, on v1 with a Ray cluster `run_ppo` starts itself, TransferQueue's storage units fit its
    CPUs (`ray_cpus`; on `this_machine` by default its own). Returns the line saying which replay age bound is in
    force (v1; the launch prints it)."""
    from .v1_checks import check_paths, check_resources, local_ray_cpus, replay_settings

    check_paths(config)
    if not config.trainer.get("use_v1", True):
        return None
    cpus = local_ray_cpus(config) if this_machine and ray_cpus is None else ray_cpus
    check_resources(config, cpus, "the local Ray cluster run_ppo starts")
    return replay_settings(config)[3]


# verl's validate_config messages name verl's own spelling or none; the override that sets each
VERL_FIELDS = (("real_train_batch_size", "data.train_batch_size"),
               ("actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"),
               ("'actor.ppo_micro_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
               ("log_prob_micro_batch_size", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
               ("loss_agg_mode", "actor_rollout_ref.actor.loss_agg_mode"),
               ("temperature", "actor_rollout_ref.rollout.temperature"))


def check_verl(config) -> None:
    """verl's own `validate_config` (what `run_ppo`'s trainer checks), its assertions as ValueErrors naming the
    override."""
    import contextlib
    import io

    from hydra.errors import InstantiationException
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines; the launch prints its own
            validate_config(config=config, use_reference_policy=need_reference_policy(config),
                            use_critic=need_critic(config))
    except (AssertionError, ValueError, InstantiationException) as e:  # the last: a config dataclass's own check
        message = " ".join(str(e).split())
        field = next((f for phrase, f in VERL_FIELDS if phrase in message), "launch")
        raise ValueError(f"{field}: verl's validate_config refuses the config: {message}; allowed: what it asks "
                         "for") from None


def launch_checks(config, write: bool = True, this_machine: bool = True) -> list[Callable[[], Optional[str]]]:
    """The entry point's checks, in order: each raises ValueError naming the field, or returns a line to print.
    `write`: record this run in its checkpoint folder (the launch; the preflight does not). `this_machine`: the
    machine that launches (its CPUs, printing); the preflight checks only what the config says of Ray's CPUs."""
    from .limits import check_limits
    from .run_folder import check_run_folder
    from .seeds import check_seeds

    cpus = None if this_machine else _configured_cpus(config)
    return [lambda: check_config(config) and None,
            lambda: check_environment(config, cpus, this_machine),
            lambda: check_limits(config),
            lambda: check_verl(config),
            lambda: check_seeds(config),
            lambda: check_run_folder(config, write)]  # last: it records this run in its checkpoint folder


def _configured_cpus(config) -> Optional[float]:
    num = config.get("ray_kwargs", {}).get("ray_init", {}).get("num_cpus")
    return float(num) if num is not None else None


@hydra.main(config_path="config", config_name="replay_ppo_trainer", version_base=None)
def main(config) -> None:
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    try:
        for check in launch_checks(config):
            line = check()
            if line:
                print(line)
        runner = check_config(config)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    run_ppo(config, task_runner_class=runner)


if __name__ == "__main__":
    main()
