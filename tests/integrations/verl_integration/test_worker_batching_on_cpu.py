"""`ReplayRayPPOTrainer._update_actor` through verl 0.9.1's real worker-side batching and PPO loss. CPU only.

The actor worker group is an in-process stand-in whose `update_actor` runs verl's own code for every DP rank: the
dispatch's DP split (`_split_args_kwargs_data_proto`), `TrainingWorker.train_mini_batch` (the mini-batch
iterator), `TrainingWorker.train_batch`, `BaseEngine.train_batch` -> `FSDPEngine.forward_backward_batch`
(`prepare_micro_batches`, static or dynamic) and verl's `ppo_loss` on every micro-batch. Only the model is fake:
its log-probs for a rollout are the rollout's birth-step log-probs + DELTA, so verl's PPO ratio is exp(DELTA) on
every row, fresh or replayed, exactly when the row reaches the loss with its stored old log-probs.
"""
from __future__ import annotations

import inspect
import math
import pickle
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("verl.protocol")  # a real module: a folder named verl on sys.path must not count
pytest.importorskip("ray")

from test_trainer_on_cpu import N_PROMPTS, ROLLOUT_N, make_trainer, verl_config  # noqa: E402
from verl_batches import make_batch  # noqa: E402

DELTA = 0.1  # log-ratio of the fake "current" policy to every rollout's behaviour policy (inside the clip range)


@pytest.fixture(scope="module", autouse=True)
def process_group(tmp_path_factory):
    """verl's worker code all-gathers over the DP group: one gloo process stands for every rank in turn."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def signature(input_ids_row: torch.Tensor) -> tuple:
    return tuple(input_ids_row.tolist())


def with_unique_responses(batch, first_id: int):
    """Make every rollout's tokens unique (short random responses can repeat), so a row's tokens identify it."""
    td = batch.batch
    ids = torch.arange(first_id, first_id + len(batch))
    td["responses"][:, 0] = ids
    td["input_ids"][:, td["prompts"].shape[1]] = ids
    return batch


class BirthRecord:
    """Old log-probs and advantages of every fresh row at its birth step, by unpadded prompt+response tokens."""

    def __init__(self):
        self.rows = {}

    def add(self, batch) -> None:
        td = batch.batch
        for i in range(len(batch)):
            att = td["attention_mask"][i].bool()
            m = td["response_mask"][i].bool()
            sig = signature(td["input_ids"][i][att])
            assert sig not in self.rows
            self.rows[sig] = (td["old_log_probs"][i][m].clone(), td["advantages"][i][m].clone())


def _fake_engine_class():
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    class FakeEngine(FSDPEngine):
        """FSDPEngine with verl's forward_backward_batch and BaseEngine.train_batch; no model, no optimizer."""

        def __init__(self, rank, dp, births, log):
            self.rank, self.dp, self.births, self.log = rank, dp, births, log
            self.ulysses_sequence_parallel_size = 1
            self.scaler = None

        def get_data_parallel_size(self):
            return self.dp

        def get_data_parallel_rank(self):
            return self.rank

        def get_data_parallel_group(self):
            return None  # the single gloo process group

        def is_mp_src_rank_with_outputs(self):
            return True

        @contextmanager
        def train_mode(self, **kwargs):
            yield

        def _gradient_sync_context(self, **kwargs):
            return nullcontext()

        def optimizer_zero_grad(self):
            pass

        def optimizer_step(self):
            return 0.0

        def lr_scheduler_step(self):
            return 1e-6

        def forward_step(self, micro_batch, loss_function, forward_only):
            ids = micro_batch["input_ids"]
            P = micro_batch["prompts"].shape[1]
            plen = micro_batch["attention_mask"][:, :P].sum(-1)
            logps, rows = [], []
            for i, row in enumerate(ids.unbind()):
                old, adv = self.births.rows[signature(row)]
                lp = torch.zeros(len(row))
                p = int(plen[i])
                lp[p - 1 : p - 1 + len(old)] = old + DELTA  # model outputs are shifted left by one token
                logps.append(lp.requires_grad_())  # verl's engine calls backward() on the loss
                rm = micro_batch["response_mask"][i].bool()
                rows.append(
                    {
                        "sig": signature(row),
                        "old_ok": torch.equal(micro_batch["old_log_probs"][i][rm], old),
                        "adv_ok": torch.equal(micro_batch["advantages"][i][rm], adv),
                    }
                )
            log_probs = torch.nested.as_nested_tensor(logps, layout=torch.jagged)
            loss, metrics = loss_function(model_output={"log_probs": log_probs}, data=micro_batch, dp_group=None)
            self.log.append(
                {
                    "rank": self.rank,
                    "rows": rows,
                    "tokens": int(ids.offsets().diff().sum()),
                    "ppo_kl": float(metrics["actor/ppo_kl"].values[0]),
                    "clipfrac": float(metrics["actor/pg_clipfrac"].values[0]),
                }
            )
            return loss, {"model_output": {}, "loss": loss.detach().item(), "metrics": {}}

    return FakeEngine


class WorkerSideActorWG:
    """Actor worker group running verl's worker-side update code in-process, rank after rank."""

    def __init__(self, config, dp_size, births):
        from functools import partial

        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.engine_workers import TrainingWorker
        from verl.workers.utils.losses import ppo_loss

        actor = config.actor_rollout_ref.actor
        self._dispatch_info = {"actor": list(range(dp_size))}
        self.dp = dp_size
        self.updates, self.log = [], []
        actor_config = omega_conf_to_dataclass(actor)
        engine_config = SimpleNamespace(
            forward_only=False,
            use_dynamic_bsz=actor.use_dynamic_bsz,
            max_token_len_per_gpu=actor.ppo_max_token_len_per_gpu,
            micro_batch_size_per_gpu=actor.ppo_micro_batch_size_per_gpu,
            use_fused_kernels=False,
        )
        engine_cls = _fake_engine_class()
        self.ranks = []
        for r in range(dp_size):
            w = SimpleNamespace(
                engine=engine_cls(r, dp_size, births, self.log),
                engine_config=engine_config,
                model_config={"use_remove_padding": True},
                loss_fn=partial(ppo_loss, config=actor_config),
                profiler=SimpleNamespace(step=lambda: None),
                device_name="cpu",
                flops_counter=None,
            )
            w.train_batch = inspect.unwrap(TrainingWorker.train_batch).__get__(w)
            w._postprocess_output = TrainingWorker._postprocess_output.__get__(w)
            w.train_mini_batch = inspect.unwrap(TrainingWorker.train_mini_batch).__get__(w)
            self.ranks.append(w)

    def update_actor(self, td):
        from verl.single_controller.base.decorator import _split_args_kwargs_data_proto
        from verl.utils import tensordict_utils as tu

        (chunks,), _ = _split_args_kwargs_data_proto(self.dp, td)
        start = len(self.log)
        for w, chunk in zip(self.ranks, chunks, strict=True):
            chunk = pickle.loads(pickle.dumps(chunk))  # what Ray's transport to the worker process does
            assert w.train_mini_batch(chunk) is not None
        self.updates.append({"rows": td.batch_size[0], "log": self.log[start:]})
        return tu.get_tensordict({}, non_tensor_dict={"metrics": {"mfu": 0.0}})


CASES = [  # (dp, static micro-batch size per GPU or None for use_dynamic_bsz, ppo_epochs)
    (2, 2, 1),
    (2, 4, 2),
    (4, 1, 1),
    (4, 2, 1),
    (4, None, 2),
]


@pytest.fixture
def cpu_device(monkeypatch):
    """verl's platform layer assumes CUDA for device ids and memory stats; this is a CPU-only torch."""
    import verl.workers.engine.fsdp.transformer_impl as fsdp_impl
    import verl.workers.engine_workers as engine_workers

    monkeypatch.setattr(fsdp_impl, "get_device_id", lambda: "cpu")
    memory = SimpleNamespace(max_memory_allocated=lambda: 0, max_memory_reserved=lambda: 0)
    monkeypatch.setattr(engine_workers, "get_torch_device", lambda: memory)


@pytest.mark.parametrize("dp_size,micro,epochs", CASES)
def test_update_actor_through_verl_worker_batching_and_ppo_loss(tmp_path, cpu_device, dp_size, micro, epochs):
    bsz = (
        ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40",
         "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true"]
        if micro is None
        else [f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}"]
    )
    cfg = verl_config(
        tmp_path, "replay.replay_ratio=0.5", "replay.tau_max=3", f"actor_rollout_ref.actor.ppo_epochs={epochs}", *bsz
    )
    t = make_trainer(cfg, dp_size)
    births = BirthRecord()
    wg = t.actor_rollout_wg = WorkerSideActorWG(cfg, dp_size, births)
    K = N_PROMPTS // 4  # optimizer steps per epoch without replay (ppo_mini_batch_size = 4 prompts)
    n_replayed = 0
    for step in range(1, 5):
        t.global_steps = step
        g = np.random.default_rng(step + 31 * dp_size)
        rewards = (g.random(N_PROMPTS * ROLLOUT_N) < [0.3, 0.6][step % 2]).astype(np.float32)
        batch = with_unique_responses(make_batch(step, rewards=rewards), 1000 * step)
        births.add(batch)
        t._update_actor(batch)
        plan = t.replay_hook.last_plan
        update = wg.updates[-1]
        assert update["rows"] == plan.n_total
        n_replayed += plan.n_replay
        mini_per_rank = plan.mini_batch_rows // dp_size
        for rank in range(dp_size):
            mbs = [e for e in update["log"] if e["rank"] == rank]
            rows = sum(len(e["rows"]) for e in mbs)
            assert rows == plan.n_total // dp_size * epochs  # every row of the rank's share, once per epoch
            if micro is not None:
                assert all(len(e["rows"]) == micro for e in mbs)  # prepare_micro_batches' static chunks
                assert len(mbs) == K * epochs * mini_per_rank // micro
            else:
                assert all(e["tokens"] <= 40 for e in mbs if len(e["rows"]) > 1)
        seen = [r["sig"] for e in update["log"] for r in e["rows"]]
        assert len(seen) == plan.n_total * epochs
        for e in update["log"]:
            assert all(r["old_ok"] and r["adv_ok"] for r in e["rows"])  # stored values reach the loss unchanged
            assert math.isclose(e["ppo_kl"], -DELTA, rel_tol=1e-4)  # verl's ratio is exp(DELTA) on every row
            assert e["clipfrac"] == 0.0
    assert n_replayed > 0
