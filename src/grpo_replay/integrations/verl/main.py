"""Entry point: `python -m grpo_replay.integrations.verl.main [hydra overrides]`.

The same as `python -m verl.trainer.main_ppo` with the config `replay_ppo_trainer` (verl's `ppo_trainer` plus the
`replay` group, `trainer.use_v1=false`) and `ReplayTaskRunner`. Pick a preset with `replay=paper|grpo|uniform_pool|
sigma_pool` and override fields with `replay.tau_max=5` etc.
"""
from __future__ import annotations

import hydra

from .hook import split_config


@hydra.main(config_path="config", config_name="replay_ppo_trainer", version_base=None)
def main(config) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from .runner import ReplayTaskRunner

    auto_set_device(config)
    split_config(OmegaConf.to_container(config.replay, resolve=True))  # fail fast on a bad replay setting
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=ReplayTaskRunner)


if __name__ == "__main__":
    main()
