"""`grpo-replay preflight`: a launch resolved exactly as it would run, checked before any GPU time.

For the launch a user would type (`grpo-replay train` / `compare`, a TRL script with its YAML and accelerate
config, a verl launcher with its overrides) it reports the software stack and whether the host's driver runs it
(`host`), memory per phase per GPU (`train_run`, on the trainer's own estimate `trainer.memory`), replay rows per
step after the engine's batch mapping (`step_plan`), seeds, run directories and whether they would resume,
and the data; what would fail or silently change the method is a `Refusal` naming the field and the fix
(`report`). Model shapes come from config-level facts (`shapes`): nothing is downloaded, so a CPU machine checks
a recipe meant for eight GPUs. The command line (`cli/preflight.py`) picks the resolver by the launch's form. A verl
launch goes through the entry point's own checks on its composed config (`verl_config`), run by the launch's own
python where this one has no verl (`verl_elsewhere`).
"""
