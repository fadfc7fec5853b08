"""Entry point: `python -m grpo_replay.integrations.verl.main [hydra overrides]`.

The same as `python -m verl.trainer.main_ppo` with the config `replay_ppo_trainer` (verl's `ppo_trainer` plus the
`replay` group) and a replay task runner: verl's v1 trainer by default (`trainer.use_v1=true`, `ReplayTaskRunnerV1`),
the legacy `RayPPOTrainer` with `trainer.use_v1=false` (`ReplayTaskRunner`). Pick a preset with
`replay=paper|grpo|uniform_pool|sigma_pool` and override fields with `replay.tau_max=5` etc. A bad replay setting or
an unsupported `trainer.v1.trainer_mode`, a configuration replay cannot run, a missing local path or too few CPUs
for TransferQueue, or a checkpoint folder another run wrote (`run_folder.py`) is refused with exit status 2 before
Ray starts; the launch says whether it resumes a checkpoint.
"""
from __future__ import annotations

import sys

import hydra

from .run_folder import check_run_folder
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


def check_environment(config) -> None:
    """What this launch needs from the machine, before Ray starts (ValueError naming the field): local model and
    data paths exist and, on v1 with a Ray cluster `run_ppo` starts itself, TransferQueue's storage units fit its
    CPUs. Prints the replay age bound in force (v1)."""
    from .v1_checks import check_paths, check_resources, local_ray_cpus, replay_settings

    check_paths(config)
    if config.trainer.get("use_v1", True):
        check_resources(config, local_ray_cpus(config), "the local Ray cluster run_ppo starts")
        print(replay_settings(config)[3])


@hydra.main(config_path="config", config_name="replay_ppo_trainer", version_base=None)
def main(config) -> None:
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    try:
        runner = check_config(config)
        check_environment(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
        print(check_run_folder(config))  # last: it records this run in its checkpoint folder
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    run_ppo(config, task_runner_class=runner)


if __name__ == "__main__":
    main()
