"""The built-in trainer's replay and buffer metrics are named by `grpo_replay.metric_names` (the one vocabulary
TRL and verl log under too)."""
import re
from pathlib import Path

import torch

from grpo_replay import ReplayBuffer, ReplayConfig, compose_batch, metric_names, split_metrics
from helpers import make_batch


def test_every_replay_and_buffer_key_the_core_emits_is_a_named_metric():
    buf = ReplayBuffer(ReplayConfig.paper(warmup_steps=0, max_uses=2, max_drift=0.5), seed=0)
    buf.add(make_batch(seed=0), step=0)
    batch = compose_batch(make_batch(seed=1, step=1), buf, step=1).batch
    assert bool(batch.is_replay.any())
    stats = {"mask": batch.completion_mask.bool(), "ratio": torch.ones(batch.completion_mask.shape),
             "clipped": torch.zeros(batch.completion_mask.shape, dtype=torch.bool)}
    keys = set(split_metrics(batch, 1, stats)) | set(buf.stats(2))
    assert not metric_names.undeclared(keys), metric_names.undeclared(keys)
    assert {metric_names.REPLAY_COUNT, metric_names.FRESH_COUNT, metric_names.REPLAY_AGE_MEAN,
            metric_names.BUFFER_EVICTED_AGE, metric_names.BUFFER_EVICTED_USES, metric_names.BUFFER_EVICTED_DRIFT,
            metric_names.REPLAY_CLIP_FRAC, metric_names.FRESH_RATIO_MAX} <= keys


def test_a_replay_key_outside_the_names_is_undeclared_and_backend_only_keys_are_declared():
    assert metric_names.undeclared({"replay/rows_fresh", "fresh/other", "buffer/x", "loss", "reward"}) == {
        "replay/rows_fresh", "fresh/other", "buffer/x"}
    assert not metric_names.undeclared(set(metric_names.BACKEND_ONLY) - {metric_names.REPLAY_GLOBAL_SEQLEN})
    assert not metric_names.undeclared({"replay/global_seqlen/min", metric_names.ZERO_VARIANCE_SHARE})
    assert all(reason for reason in metric_names.BACKEND_ONLY.values())


def test_docs_metrics_md_lists_every_name_and_every_backend_only_key():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*)`", doc))
    missing = {n for n in metric_names.names() if "{" not in n and n not in documented}
    assert not missing, f"docs/metrics.md does not name {sorted(missing)}"
