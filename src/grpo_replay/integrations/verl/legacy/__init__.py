"""grpo-replay on verl's legacy `RayPPOTrainer` (`trainer.use_v1=false`), which verl 0.9.1 marks deprecated and
still ships.

- `ReplayHook` (hook.py): fresh `DataProto` -> composed `DataProto`; needs only a plain `pip install verl`.
- `ReplayRayPPOTrainer` (trainer.py): `RayPPOTrainer` with replay in `_update_actor` and the buffer saved in verl's
  checkpoint folder; needs `verl[verl-core]` (Ray).
- `ReplayTaskRunner` (runner.py): verl's legacy task runner building `ReplayRayPPOTrainer`.

Nothing is imported here, so that the hook works without Ray; the package `grpo_replay.integrations.verl`
exports the public names.
"""
