"""`grpo-replay train --backend trl`: the same `TrainConfig` run through TRL's GRPOTrainer with replay
(`integrations.trl.ReplayGRPOTrainer`), claimed, evaluated and summarised like a built-in run.

`backend` runs it (the testbed and the real-model paths), `settings` decides what each TrainConfig key does under
TRL (`settings.KEYS`, `settings.check`, `settings.trl_kwargs`), `metrics` writes its metrics.jsonl rows under the
built-in trainer's names. They sit in the trainer layer, beside the built-in trainer whose run directory,
lifecycle, model loading and rewards they share; `integrations.trl` holds only the adapter over TRL itself.
"""
