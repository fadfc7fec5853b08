"""The built-in trainer's replay and buffer metrics are named by `grpo_replay.metric_names` (the one vocabulary
TRL and verl log under too)."""
import torch

from grpo_replay import ReplayBuffer, ReplayConfig, compose_batch, metric_names, split_metrics
from helpers import make_batch

NAMES = {v for k, v in vars(metric_names).items() if k.isupper() and isinstance(v, str)}


def test_every_replay_and_buffer_key_the_core_emits_is_a_named_metric():
    buf = ReplayBuffer(ReplayConfig.paper(warmup_steps=0, max_uses=2, max_drift=0.5), seed=0)
    buf.add(make_batch(seed=0), step=0)
    batch = compose_batch(make_batch(seed=1, step=1), buf, step=1).batch
    assert bool(batch.is_replay.any())
    stats = {"mask": batch.completion_mask.bool(), "ratio": torch.ones(batch.completion_mask.shape),
             "clipped": torch.zeros(batch.completion_mask.shape, dtype=torch.bool)}
    keys = set(split_metrics(batch, 1, stats)) | set(buf.stats(2))
    counted = {"fresh/reward", "replay/reward", "fresh/ratio_mean", "fresh/ratio_max", "replay/ratio_mean",
               "replay/ratio_max", "fresh/clip_frac", "replay/clip_frac", "buffer/mean_age", "buffer/max_age",
               "buffer/age_hist", "buffer/bytes"}  # per-kind update and buffer-state statistics (docs/metrics.md)
    assert {k for k in keys if k.startswith(("replay/", "buffer/", "fresh/"))} - counted <= NAMES
    assert {metric_names.REPLAY_COUNT, metric_names.FRESH_COUNT, metric_names.REPLAY_AGE_MEAN,
            metric_names.BUFFER_EVICTED_AGE, metric_names.BUFFER_EVICTED_USES, metric_names.BUFFER_EVICTED_DRIFT} <= keys
