"""Both verl trainers resolve the `replay` group once, when built, and read the result at every step: no step
resolves it again. CPU only: verl's own constructors (which need GPU worker groups) are replaced by one that keeps
the config, so only the replay trainers' own `__init__` runs."""
from __future__ import annotations

import pytest

pytest.importorskip("verl.protocol")
pytest.importorskip("ray")

from verl_batches import make_batch  # noqa: E402

from grpo_replay.config import ReplayConfig  # noqa: E402


@pytest.fixture
def resolutions(monkeypatch) -> list:
    """One entry per resolution of a `replay` group (each builds its ReplayConfig from a preset)."""
    calls, real = [], ReplayConfig.from_preset

    def counted(cls, *a, **k):
        calls.append(a[:1])
        return real(*a, **k)

    monkeypatch.setattr(ReplayConfig, "from_preset", classmethod(counted))
    return calls


def test_the_legacy_trainer_resolves_its_settings_once_and_never_per_step(tmp_path, monkeypatch, resolutions):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from test_trainer_on_cpu import FakeActorWG, FakeLoader, verl_config

    from grpo_replay.integrations.verl.legacy.trainer import ReplayRayPPOTrainer

    cfg = verl_config(tmp_path, "replay.tau_max=3")
    monkeypatch.setattr(RayPPOTrainer, "__init__", lambda self, config, **kw: setattr(self, "config", config))
    t = ReplayRayPPOTrainer(cfg)
    assert len(resolutions) == 1 and t.replay_hook.config.tau_max == 3
    t.actor_rollout_wg, t.use_critic, t.train_dataloader = FakeActorWG(1), False, FakeLoader()
    for step in (1, 2, 3):
        t.global_steps = step
        t._update_actor(make_batch(step))
    assert len(resolutions) == 1 and t.replay_hook.last_plan.n_replay > 0


def test_the_v1_trainer_resolves_its_settings_once(tmp_path, monkeypatch, resolutions):
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from v1_setup import v1_config

    from grpo_replay.integrations.verl import trainer_v1
    from grpo_replay.integrations.verl.row_store import RowStore

    cfg = v1_config(tmp_path, "sync", "replay.tau_max=3")
    monkeypatch.setattr(PPOTrainerSync, "__init__", lambda self, config: setattr(self, "config", config))
    monkeypatch.setattr(trainer_v1, "remote_row_store", RowStore)  # the row store in this process, not an actor
    t = trainer_v1.ReplayPPOTrainerSync(cfg)
    # its launch checks (check_config, check_storage) read what the trainer resolved (`fit` adds none: the fit
    # tests count the whole run)
    assert len(resolutions) == 1 and t.replay_store.config.tau_max == 3
