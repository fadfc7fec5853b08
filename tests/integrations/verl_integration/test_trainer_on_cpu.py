"""`ReplayRayPPOTrainer`'s overridden methods, the task runner and the Hydra `replay` group. CPU only.

A real `RayPPOTrainer` cannot be built on CPU (its worker groups need GPU rollout servers), so the trainer is made
with `object.__new__` and given verl's real composed config plus a fake actor worker group. The overridden methods
and verl's own `_update_actor` / `_save_checkpoint` / `_load_checkpoint` / `_balance_batch` bodies run unchanged;
only the remote calls (`update_actor`, `save_checkpoint`, `load_checkpoint`) are fakes that record what they got.
"""
from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

pytest.importorskip("verl.protocol")  # a real module: a folder named verl on sys.path must not count
pytest.importorskip("ray")

from hydra import compose, initialize_config_module  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl_batches import make_batch  # noqa: E402

from grpo_replay.config import PRESETS, ReplayConfig  # noqa: E402
from grpo_replay.integrations.verl.settings import CONFIG_FIELDS, SETTINGS_FIELDS, split_config  # noqa: E402
from grpo_replay.integrations.verl.checkpoints import BUFFER_NAME  # noqa: E402
from grpo_replay.integrations.verl.legacy.trainer import ReplayRayPPOTrainer, make_hook  # noqa: E402

N_PROMPTS, ROLLOUT_N = 8, 4


def verl_config(tmp_path, *overrides):
    with initialize_config_module(config_module="grpo_replay.integrations.verl.config", version_base=None):
        return compose(
            config_name="replay_ppo_trainer",
            overrides=[
                f"actor_rollout_ref.rollout.n={ROLLOUT_N}",
                f"data.train_batch_size={N_PROMPTS}",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # 2 optimizer steps per batch without replay
                "algorithm.adv_estimator=grpo",
                f"trainer.default_local_dir={tmp_path}/ckpt",
                "replay.warmup_steps=0",
                "trainer.use_v1=false",  # the legacy RayPPOTrainer (verl's default is v1)
                *overrides,
            ],
        )


class FakeActorWG:
    """Stands in for the actor worker group: records the TensorDict verl's _update_actor sends."""

    def __init__(self, dp_size: int):
        self._dispatch_info = {"actor": list(range(dp_size))}
        self.updates = []
        self.saved = []
        self.loaded = []

    def update_actor(self, td):
        from verl.utils import tensordict_utils as tu

        self.updates.append(
            {
                "rows": td.batch_size[0],
                "mini_batch_size": tu.get(td, "mini_batch_size"),
                "global_batch_size": tu.get(td, "global_batch_size"),
                "advantages": td["advantages"].clone(),
                "old_log_probs": td["old_log_probs"].clone(),
                "tokens": td["input_ids"].offsets().diff().tolist(),
            }
        )
        return tu.get_tensordict({}, non_tensor_dict={"metrics": {"mfu": 0.5, "pg_loss": [0.1]}})

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        self.saved.append(local_path)

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.loaded.append(local_path)


class FakeLoader:
    def __len__(self):
        return 100

    def state_dict(self):
        return {"pos": 1}

    def load_state_dict(self, s):
        self.loaded = s


def make_trainer(config, dp_size=2):
    t = object.__new__(ReplayRayPPOTrainer)  # RayPPOTrainer.__init__ needs GPU worker groups
    t.config = config
    t.replay_hook = make_hook(config)
    t.actor_rollout_wg = FakeActorWG(dp_size)
    t.use_critic = False
    t.train_dataloader = FakeLoader()
    t.global_steps = 0
    return t


@pytest.mark.parametrize("dp_size", [1, 2, 4])
def test_update_actor_composes_and_keeps_optimizer_steps(tmp_path, dp_size):
    cfg = verl_config(tmp_path, "replay.tau_max=2", "replay.replay_ratio=1.0")
    t = make_trainer(cfg, dp_size)
    N = N_PROMPTS * ROLLOUT_N
    mb_fresh = 4 * ROLLOUT_N
    for step in range(1, 8):
        t.global_steps = step
        out = t._update_actor(make_batch(step, n_prompts=N_PROMPTS, n=ROLLOUT_N))
        sent = t.actor_rollout_wg.updates[-1]
        plan = t.replay_hook.last_plan
        assert sent["rows"] == plan.n_total and plan.n_total % dp_size == 0
        assert sent["mini_batch_size"] == sent["global_batch_size"] == plan.mini_batch_rows
        assert sent["rows"] // sent["mini_batch_size"] == N // mb_fresh  # no extra optimizer step
        assert sent["mini_batch_size"] % dp_size == 0  # verl's train_mini_batch asserts this
        assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 4  # restored after the call
        m = out.meta_info["metrics"]
        assert "perf/mfu/actor" in m and m["replay/count"] == plan.n_replay
        assert m["replay/age_max"] <= 2 if plan.n_replay else "replay/age_max" not in m
        if step > 1:
            assert plan.n_replay > 0
    assert len(t.replay_hook.buffer) > 0


def test_update_actor_sends_stored_values_for_replay_rows(tmp_path):
    cfg = verl_config(tmp_path, "replay.replay_ratio=1.0", "trainer.balance_batch=false")
    t = make_trainer(cfg, 1)
    t.global_steps = 1
    first = make_batch(1)
    t._update_actor(first)
    t.global_steps = 2
    t._update_actor(make_batch(2))
    plan = t.replay_hook.last_plan
    sent = t.actor_rollout_wg.updates[-1]
    assert plan.n_replay > 0
    # nested (unpadded) advantages/old log-probs of the replay rows equal values that existed at step 1
    adv1 = {round(float(a), 5) for a in first.batch["advantages"][first.batch["response_mask"].bool()]}
    adv = sent["advantages"]
    rows = adv.unbind() if adv.is_nested else list(adv)
    for row in rows[plan.n_fresh_used :]:
        assert round(float(row[0]), 5) in adv1


def test_checkpoint_saves_and_restores_buffer(tmp_path):
    cfg = verl_config(tmp_path, "trainer.max_actor_ckpt_to_keep=2")
    t = make_trainer(cfg)
    for step in range(1, 5):
        t.global_steps = step
        t._update_actor(make_batch(step))
        t._save_checkpoint()
    root = tmp_path / "ckpt"
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "4"
    for step in (3, 4):
        assert (root / f"global_step_{step}" / f"{BUFFER_NAME}.npz").exists()
        assert (root / f"global_step_{step}" / f"{BUFFER_NAME}.json").exists()
    for step in (1, 2):  # pruned like verl's actor checkpoints (max_actor_ckpt_to_keep=2)
        assert not (root / f"global_step_{step}" / f"{BUFFER_NAME}.json").exists()

    r = make_trainer(verl_config(tmp_path, "trainer.resume_mode=auto"))
    r._load_checkpoint()
    assert r.global_steps == 4
    assert r.actor_rollout_wg.loaded == [str(root / "global_step_4" / "actor")]
    assert len(r.replay_hook.buffer) == len(t.replay_hook.buffer) > 0
    a, b = t.replay_hook.state_dict(), r.replay_hook.state_dict()
    assert a["rng"] == b["rng"] and a["totals"] == b["totals"]
    for k, v in a["storage"].items():
        if isinstance(v, np.ndarray):
            assert np.array_equal(v, b["storage"][k]), k
    # the resumed run draws exactly what the original would have drawn
    t.global_steps = r.global_steps = 5
    ta = t._update_actor(make_batch(5))
    tb = r._update_actor(make_batch(5))
    sa, sb = t.actor_rollout_wg.updates[-1]["old_log_probs"], r.actor_rollout_wg.updates[-1]["old_log_probs"]
    assert all(torch.equal(x, y) for x, y in zip(sa.unbind(), sb.unbind(), strict=True))
    assert ta.meta_info["metrics"]["replay/count"] == tb.meta_info["metrics"]["replay/count"]


def test_deprecated_remove_previous_ckpt_in_save_prunes_buffers_as_verl_prunes_the_actor(tmp_path):
    t = make_trainer(verl_config(tmp_path, "+trainer.remove_previous_ckpt_in_save=true"))
    for step in (1, 2):
        t.global_steps = step
        t._update_actor(make_batch(step))
        t._save_checkpoint()
    root = tmp_path / "ckpt"
    assert (root / "global_step_2" / f"{BUFFER_NAME}.json").exists()
    assert not (root / "global_step_1" / f"{BUFFER_NAME}.json").exists()  # verl keeps one actor checkpoint


def test_a_failed_verl_save_leaves_the_last_complete_checkpoints_buffer(tmp_path):
    t = make_trainer(verl_config(tmp_path, "trainer.max_actor_ckpt_to_keep=1"))
    t.global_steps = 1
    t._update_actor(make_batch(1))
    t._save_checkpoint()

    def fails(*a, **k):
        raise OSError("disk full")

    t.global_steps = 2
    t._update_actor(make_batch(2))
    t.actor_rollout_wg.save_checkpoint = fails
    with pytest.raises(OSError, match="disk full"):
        t._save_checkpoint()
    # latest_checkpointed_iteration.txt still says 1: its buffer must still be there to resume
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert (tmp_path / "ckpt" / "global_step_1" / f"{BUFFER_NAME}.npz").exists()


def test_resume_path_and_disabled_resume(tmp_path):
    cfg = verl_config(tmp_path)
    t = make_trainer(cfg)
    sizes = {}
    for step in (1, 2):
        t.global_steps = step
        t._update_actor(make_batch(step))
        t._save_checkpoint()
        sizes[step] = len(t.replay_hook.buffer)
    folder = str(tmp_path / "ckpt" / "global_step_1")
    r = make_trainer(verl_config(tmp_path, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={folder}"))
    r._load_checkpoint()
    assert r.global_steps == 1 and len(r.replay_hook.buffer) == sizes[1] != sizes[2]
    d = make_trainer(verl_config(tmp_path, "trainer.resume_mode=disable"))
    assert d._load_checkpoint() == 0 and len(d.replay_hook.buffer) == 0


def test_missing_buffer_is_an_error_unless_empty_resume_is_allowed(tmp_path):
    cfg = verl_config(tmp_path)
    t = make_trainer(cfg)
    t.global_steps = 1
    t._update_actor(make_batch(1))
    t._save_checkpoint()
    folder = tmp_path / "ckpt" / "global_step_1"
    os.remove(folder / f"{BUFFER_NAME}.npz")
    with pytest.raises(FileNotFoundError, match=r"replay_buffer\.npz.*allow_empty_resume"):
        make_trainer(verl_config(tmp_path))._load_checkpoint()
    os.remove(folder / f"{BUFFER_NAME}.json")
    with pytest.raises(FileNotFoundError, match=r"replay_buffer\.json"):
        make_trainer(verl_config(tmp_path))._load_checkpoint()
    r = make_trainer(verl_config(tmp_path, "replay.allow_empty_resume=true"))
    r._load_checkpoint()
    assert r.global_steps == 1 and len(r.replay_hook.buffer) == 0


@pytest.mark.parametrize(
    "override,message",
    [
        ("actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
         "actor_rollout_ref.rollout.enable_rollout_routing_replay=true: replay on the legacy trainer cannot rebuild"),
        ("+actor_rollout_ref.actor.megatron.router_replay.mode=R2",
         "actor_rollout_ref.actor.megatron.router_replay.mode='R2': replay on the legacy trainer cannot rebuild"),
        ("distillation.enabled=true", "distillation.enabled=true: replay on the legacy trainer cannot rebuild"),
        ("replay.max_drift=0.5", "ReplayConfig.max_drift=0.5 is invalid; allowed: None (the verl legacy integration"),
    ],
)
def test_entry_point_refuses_router_replay_and_distillation_on_the_legacy_trainer(tmp_path, override, message):
    """The entry point's `check_config` (run before Ray starts) and the legacy runner inside its actor refuse
    what the hook cannot rebuild for a stored rollout; the same config with the setting off is accepted."""
    from grpo_replay.integrations.verl.legacy.runner import ReplayTaskRunner, ReplayTaskRunnerImpl
    from grpo_replay.integrations.verl.main import check_config

    assert check_config(verl_config(tmp_path)) is ReplayTaskRunner
    cfg = verl_config(tmp_path, override)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_config(cfg)
    with pytest.raises(ValueError, match=re.escape(message)):
        ReplayTaskRunnerImpl().run(cfg)


def test_task_runner_builds_the_replay_trainer(monkeypatch):
    import verl.trainer.main_ppo_v0 as v0

    from grpo_replay.integrations.verl.legacy.runner import ReplayTaskRunner, ReplayTaskRunnerImpl, verl_task_runner_class

    seen = {}
    plain = verl_task_runner_class()
    monkeypatch.setattr(plain, "run", lambda self, config: seen.setdefault("cls", v0.RayPPOTrainer))
    monkeypatch.setattr(v0, "RayPPOTrainer", v0.RayPPOTrainer)  # restored after the test
    runner = ReplayTaskRunnerImpl()
    runner.run(OmegaConf.create({"trainer": {"use_v1": False}}))
    assert seen["cls"] is ReplayRayPPOTrainer
    with pytest.raises(ValueError, match="use_v1"):
        runner.run(OmegaConf.create({"trainer": {"use_v1": True}}))
    assert hasattr(ReplayTaskRunner, "remote")  # a Ray actor class, as run_ppo expects


@pytest.mark.parametrize("dp_size", [2, 4])
def test_prefix_grouper_rebalance_through_verl(tmp_path, dp_size):
    """verl's own _balance_batch with use_prefix_grouper raised on an arbitrary number of replay uids."""
    cfg = verl_config(tmp_path, "replay.replay_ratio=0.5", "actor_rollout_ref.actor.use_prefix_grouper=true")
    t = make_trainer(cfg, dp_size)
    t.use_prefix_grouper = True  # what RayPPOTrainer.__init__ reads from the config
    for step in range(1, 7):
        t.global_steps = step
        g = np.random.default_rng(step)
        out = t._update_actor(make_batch(step, rewards=(g.random(32) < 0.4).astype(np.float32)))
        plan = t.replay_hook.last_plan
        assert t.actor_rollout_wg.updates[-1]["rows"] == plan.n_total
    assert plan.n_replay > 0 and any(k.startswith("replay/global_seqlen") for k in out.meta_info["metrics"])


def test_perf_total_num_tokens_include_replayed_tokens(tmp_path):
    from verl.trainer.ppo.metric_utils import compute_throughout_metrics

    cfg = verl_config(tmp_path, "replay.replay_ratio=1.0", "trainer.balance_batch=false")
    t = make_trainer(cfg, 2)
    for step in (1, 2):
        t.global_steps = step
        batch = make_batch(step)
        fresh_tokens = int(batch.batch["attention_mask"].sum())
        t._update_actor(batch)
    plan = t.replay_hook.last_plan
    sent = t.actor_rollout_wg.updates[-1]["tokens"]  # per row, in the order fresh then replay
    replay_tokens = sum(sent[plan.n_fresh_used :])
    assert plan.n_replay > 0 and replay_tokens == plan.n_replay_tokens > 0
    perf = compute_throughout_metrics(batch=batch, timing_raw={"step": 2.0}, n_gpus=2)
    assert perf["perf/total_num_tokens"] == fresh_tokens + replay_tokens
    assert perf["perf/throughput"] == (fresh_tokens + replay_tokens) / 4.0


@pytest.mark.parametrize("preset", PRESETS)
def test_hydra_replay_group_files_are_generated(preset):
    from grpo_replay.integrations.verl.replay_group import GROUP_DIR, group_yaml

    assert (GROUP_DIR / f"{preset}.yaml").read_text() == group_yaml(preset), (
        "regenerate with: .venv-verl/bin/python -m grpo_replay.integrations.verl.replay_group"
    )


@pytest.mark.parametrize("preset", PRESETS)
def test_hydra_replay_group_matches_core_presets(tmp_path, preset):
    cfg = verl_config(tmp_path, f"replay={preset}", "replay.warmup_steps=20")
    node = OmegaConf.to_container(cfg.replay, resolve=True)
    assert set(node) == {"preset", *CONFIG_FIELDS, *SETTINGS_FIELDS}
    config, _ = split_config(node)
    assert config == ReplayConfig.from_preset(preset)
    assert cfg.trainer.use_v1 is False
    hook = make_hook(cfg)
    assert hook.config == ReplayConfig.from_preset(preset)


def test_hydra_overrides_and_verl_validation(tmp_path):
    cfg = verl_config(
        tmp_path,
        "replay.tau_max=5",
        "replay.alpha=1.0",
        "replay.capacity=null",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=2",
    )
    config, _ = split_config(OmegaConf.to_container(cfg.replay))
    assert (config.tau_max, config.alpha, config.capacity) == (5, 1.0, None)
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    # verl's own config validation accepts the composed config with the extra `replay` node
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
