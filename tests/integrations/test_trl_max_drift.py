"""replay.max_drift in ReplayGRPOTrainer through real `trainer.train()` runs (tiny Qwen2, CPU): a replayed row whose
drift from the policy about to update exceeds the bound leaves the batch and the buffer; fresh rows never do."""
from __future__ import annotations

import pytest

pytest.importorskip("trl")
import torch  # noqa: E402

from test_trl import _logged, _param_vector, _train  # noqa: E402

DRIFT_KEYS = ("replay/drift_dropped", "replay/drift_mean", "replay/drift_max", "buffer/evicted_drift")


def test_tight_bound_drops_every_replayed_row_and_trains_as_plain_grpo(tmp_path):
    """At a bound no drifted row passes, every replayed row is dropped and evicted, no fresh row is, and the update
    is exactly the update without those rows: plain GRPO's (the loss is normalised over the rows kept)."""
    bounded, _ = _train(tmp_path / "a", replay_preset="paper", max_steps=4, replay_max_drift=1e-12)
    plain, _ = _train(tmp_path / "b", replay_preset="grpo", max_steps=4)
    hist = list(bounded.replay_history)
    assert all(h["fresh_rows"] == 4 for h in hist) and all(h["replay_rows"] == 0 for h in hist)
    dropped = _logged(bounded, "replay/drift_dropped")
    assert len(dropped) == 4 and dropped[0] == 0 and all(d == 2 for d in dropped[1:])  # round(0.5 x 4) drawn a step
    assert bounded.replay_buffer.total_evicted_drift == sum(dropped)
    assert _logged(bounded, "buffer/evicted_drift")[-1] == sum(dropped)
    assert min(_logged(bounded, "replay/drift_max")) > 1e-12
    assert torch.equal(_param_vector(bounded.model), _param_vector(plain.model))


def test_loose_bound_drops_nothing_and_keeps_the_records_of_a_run_without_it(tmp_path):
    loose, _ = _train(tmp_path / "a", replay_preset="paper", max_steps=4, replay_max_drift=100.0)
    free, _ = _train(tmp_path / "b", replay_preset="paper", max_steps=4)
    assert _logged(loose, "replay/drift_dropped") == [0, 0, 0, 0] and loose.replay_buffer.total_evicted_drift == 0
    assert _logged(loose, "replay/drift_mean")  # measured: the replayed rows' drift is logged
    assert list(loose.replay_history) == list(free.replay_history)
    assert torch.equal(_param_vector(loose.model), _param_vector(free.model))

    def records(t):
        return [{k: v for k, v in row.items() if k not in DRIFT_KEYS and "time" not in k and "per_second" not in k}
                for row in t.state.log_history]

    assert records(loose) == records(free)


def test_a_bound_between_drops_only_rows_above_it(tmp_path):
    """Between the drifts seen: some replayed rows are dropped and some kept; fresh rows all stay."""
    probe, _ = _train(tmp_path / "p", replay_preset="paper", max_steps=4, replay_max_drift=100.0)
    maxima = _logged(probe, "replay/drift_max")
    bound = sorted(maxima)[len(maxima) // 2]  # the median step's largest drift
    t, _ = _train(tmp_path / "a", replay_preset="paper", max_steps=4, replay_max_drift=bound)
    dropped = sum(_logged(t, "replay/drift_dropped"))
    kept = sum(h["replay_rows"] for h in t.replay_history)
    assert dropped > 0 and kept > 0 and all(h["fresh_rows"] == 4 for h in t.replay_history)
