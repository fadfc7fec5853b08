"""Drive verl 0.9.1's real v1 `fit()` on CPU: real Ray, real TransferQueue, real dataloader / sampler /
`_balance_batch` / `_compute_old_log_prob` / `_compute_advantage` / `_update_actor` / `_compute_metrics` /
checkpointing; fakes only for what needs a GPU:

- `FakeAgentLoop`: writes each rollout into TransferQueue the way `AgentLoopWorkerTQ._agent_loop_postprocess` does
  (key `{uid}_{session}_0`, its fields and tags incl. `min_global_steps` / `max_global_steps` = the weight version
  the fake weight sync last pushed), then marks the prompt `finished` as `_run_prompt` does; the reward is a fixed
  function of the tokens;
- `FakeActorWG`: reads its batch from TransferQueue by key (as verl's workers do through tqbridge), computes log-probs
  with a tiny bigram model and steps it with verl's own `compute_policy_loss_vanilla`, recording every row it trains on;
- `FakeCheckpointManager`: the weight version pushed by `update_weights`.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 +=?"


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>"])}
    for c in CHARS:
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return fast


def write_dataset(path: str, n: int = 32) -> str:
    import pandas as pd

    rows = [
        {
            "data_source": "synthetic",
            "prompt": [{"role": "user", "content": f"what is {i} + {i % 7}?"}],
            "reward_model": {"ground_truth": str(i + i % 7), "style": "rule"},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]
    pd.DataFrame(rows).to_parquet(path)
    return path


class Bigram(torch.nn.Module):
    def __init__(self, vocab: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g) * 0.5)

    def token_logps(self, ids: torch.Tensor) -> torch.Tensor:
        """(L,) log p(ids[j+1] | ids[j]) at j, 0 at the last position (verl's layout before response_from_nested)."""
        lp = torch.log_softmax(self.table[ids[:-1]], -1).gather(1, ids[1:, None]).squeeze(1)
        return torch.cat([lp, lp.new_zeros(1)])


class FakeCheckpointManager:
    def __init__(self):
        self.version = 0

    def update_weights(self, global_steps=None):
        self.version = int(global_steps or 0)

    def sleep_replicas(self):
        pass

    def abort_replicas(self):  # colocate_async: no request is ever in flight here
        pass

    def resume_generation_replicas(self):
        pass


class FakeAgentLoop:
    """`generate_sequences(batch)` as `AgentLoopManagerTQ` + `AgentLoopWorkerTQ` do, synchronously.

    `multi_output`: session 0 of every even-indexed prompt returns two outputs, keys `{uid}_0_0` (its first turn)
    and `{uid}_0_1` (the whole session), both with the session's reward, as `_agent_loop_postprocess` writes a
    multi-output agent loop. `fail`: the last session of every odd-indexed prompt raises, so the prompt
    ends with status `failure` and one trajectory short (`_run_prompt`). `extras`: every row also carries the
    per-token fields of router replay (`routed_experts`), distillation (`teacher_ids`, `teacher_logprobs`) and a
    multi-modal model (`multi_modal_inputs`, a dict of tensors), random but fixed per row."""

    EXTRA_FIELDS = ("routed_experts", "teacher_ids", "teacher_logprobs", "multi_modal_inputs")

    def __init__(self, config, tokenizer, model: Bigram, weights: FakeCheckpointManager, multi_output=False,
                 fail=False, extras=False):
        self.config, self.tok, self.model, self.weights = config, tokenizer, model, weights
        self.multi_output, self.fail, self.extras = multi_output, fail, extras
        self.rollout_log_probs: dict[str, torch.Tensor] = {}  # by row key, as written

    @staticmethod
    def _extras(n_tokens: int, seed: int) -> dict:
        g = torch.Generator().manual_seed(seed)
        return {"routed_experts": torch.randint(0, 8, (n_tokens, 2, 2), generator=g, dtype=torch.int32),
                "teacher_ids": torch.randint(0, 40, (n_tokens, 2), generator=g),
                "teacher_logprobs": torch.randn(n_tokens, 2, generator=g),
                "multi_modal_inputs": {"pixel_values": torch.randn(3, 4, generator=g)}}

    def _row(self, prompt_ids, resp, reward, version, extra):
        ids = torch.tensor(prompt_ids + resp)
        with torch.no_grad():
            lp = self.model.token_logps(ids)[len(prompt_ids) - 1 : len(ids) - 1].float()
        c = len(resp)
        rm = torch.zeros(c)
        rm[-1] = reward
        f = {
            "prompts": torch.tensor(prompt_ids), "responses": torch.tensor(resp),
            "response_mask": torch.ones(c, dtype=torch.int64), "loss_mask": torch.ones(c, dtype=torch.int64),
            "rollout_log_probs": lp, "rm_scores": rm, "num_turns": 2,
            "input_ids": ids, "position_ids": torch.arange(len(ids)),
            "extra_fields": {"min_global_steps": version, "max_global_steps": version,
                             "reward_extra_info": {"acc": reward}},
            **extra,
        }
        tag = {"status": "success", "prompt_len": len(prompt_ids), "response_len": c, "seq_len": len(ids),
               "global_steps": extra["global_steps"], "min_global_steps": version, "max_global_steps": version}
        return f, tag

    def generate_sequences(self, batch: TensorDict) -> None:
        n = int(self.config.actor_rollout_ref.rollout.n)
        resp_len = int(self.config.data.max_response_length)
        version = self.weights.version
        keys, fields, tags, statuses = [], [], [], []
        for i in range(len(batch)):
            uid = batch["uid"][i]
            messages = batch["raw_prompt"][i]
            text = self.tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=False)
            prompt_ids = self.tok.encode(text, add_special_tokens=False)
            index = int(batch["index"][i]) if "index" in batch.keys() else i
            failed = self.fail and index % 2 == 1
            for s in range(n - 1 if failed else n):
                g = np.random.default_rng(1000 * int(batch["global_steps"]) + 10 * index + s)
                c = int(g.integers(2, resp_len + 1))
                resp = g.integers(3, len(self.tok), size=c).tolist()
                reward = float(sum(resp) % 3 == 0)
                extra = {"uid": uid, "session_id": s, "raw_prompt": list(messages), "index": index,
                         "global_steps": int(batch["global_steps"]), "data_source": "synthetic"}
                outputs = [resp[: c // 2], resp] if self.multi_output and s == 0 and index % 2 == 0 else [resp]
                for j, out in enumerate(outputs):
                    f, tag = self._row(prompt_ids, out, reward, version, extra)
                    if self.extras:
                        f.update(self._extras(len(f["input_ids"]), 1000 * int(batch["global_steps"]) + 10 * index + s))
                    keys.append(f"{uid}_{s}_{j}")
                    self.rollout_log_probs[keys[-1]] = f["rollout_log_probs"]
                    fields.append(f)
                    tags.append(tag)
            statuses.append("failure" if failed else "finished")
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id="train")
        for i in range(len(batch)):
            tq.kv_put(key=batch["uid"][i], partition_id="train", tag={"status": statuses[i]})


class FakeActorWG:
    """The actor worker group: rows read from TransferQueue by key; a bigram model stepped with verl's loss."""

    def __init__(self, config, model: Bigram, dp_size: int = 2):
        self.config, self.model, self.dp = config, model, dp_size
        self._dispatch_info = {"actor": [r for r in range(dp_size)]}
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        from verl.utils.config import omega_conf_to_dataclass

        self.loss_cfg = omega_conf_to_dataclass(config.actor_rollout_ref.actor)  # ActorConfig, as the worker has
        self.updates: list[dict] = []

    def _query_dispatch_info(self, role):
        return self._dispatch_info["actor"]

    def compute_log_prob(self, batch):
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids"])
        with torch.no_grad():
            lps = [self.model.token_logps(x) for x in data["input_ids"].unbind()]
        out = TensorDict({"log_probs": torch.nested.as_nested_tensor(lps, layout=torch.jagged),
                          "entropy": torch.nested.as_nested_tensor([torch.zeros_like(x) for x in lps],
                                                                   layout=torch.jagged)}, batch_size=len(lps))
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)
        return batch

    def update_actor(self, batch):
        from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
        from verl.utils import tensordict_utils as tu

        # the fields the batch names, as verl's tqbridge selects them for the worker
        rows = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=batch.fields)
        mb = int(batch.extra_info["mini_batch_size"])
        assert len(batch) % mb == 0 and mb % self.dp == 0, (len(batch), mb, self.dp)
        rec = {"step": None, "keys": list(batch.keys), "tags": list(batch.tags), "mini_batch_size": mb,
               "fields": sorted(rows.keys()), "rows": {}}
        recorded = ("old_log_probs", "advantages", "rollout_log_probs", *FakeAgentLoop.EXTRA_FIELDS)
        for j, k in enumerate(batch.keys):
            rec["rows"][k] = {f: _clone(rows[f][j]) for f in recorded if f in rows.keys()}
        self.updates.append(rec)
        losses = []
        for lo in range(0, len(batch), mb):
            self.opt.zero_grad()
            parts = {f: [rows[f][j] for j in range(lo, lo + mb)] for f in ("old_log_probs", "advantages")}
            ids = [rows["input_ids"][j] for j in range(lo, lo + mb)]
            lp = [self.model.token_logps(x)[-len(a) - 1 : -1] for x, a in zip(ids, parts["advantages"])]
            pad = lambda xs: torch.nn.utils.rnn.pad_sequence(xs, batch_first=True)  # noqa: E731
            mask = pad([rows["response_mask"][j] for j in range(lo, lo + mb)])  # verl's padding rows: all 0
            loss, _ = compute_policy_loss_vanilla(pad(parts["old_log_probs"]), pad(lp), pad(parts["advantages"]),
                                                  mask, "token-mean", self.loss_cfg)
            loss.backward()
            self.opt.step()
            losses.append(float(loss.detach()))
        return tu.get_tensordict({}, non_tensor_dict={"metrics": {"mfu": 0.0, "pg_loss": losses}})

    # separate_async keeps one proximal policy per parameter_sync_step cycle by parking weights on the CPU
    def save_model_to_cpu(self, n):
        self.parked = getattr(self, "parked", {})
        self.parked[n] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def restore_model_from_cpu(self, n):
        self.model.load_state_dict(self.parked[n])

    def clear_cpu_model(self, n):
        self.parked.pop(n, None)

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict()}, os.path.join(local_path, "m.pt"))

    def load_checkpoint(self, local_path, del_local_after_load=False):
        state = torch.load(os.path.join(local_path, "m.pt"))
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])


def sampler_snapshot_bytes(sampler) -> tuple[int, int]:
    """(bytes kept, peak bytes) of one poll of TransferQueue by verl's v1 sampler in this process
    (`tq.kv_list()` of every partition, every key's tag copied into its own dicts), traced with tracemalloc."""
    import gc
    import tracemalloc

    sampler._sync_metadata_from_transfer_queue()
    gc.collect()
    tracemalloc.start()
    try:
        sampler._sync_metadata_from_transfer_queue()  # frees the previous snapshot (allocated untraced)
        gc.collect()
        return tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()


def _clone(value):
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value.clone() if isinstance(value, torch.Tensor) else value


def cpu_trainer_cls(base: type) -> type:
    """`base` (a v1 trainer class) with `_setup` building the fakes instead of GPU worker groups, and every
    step's metrics recorded. Everything else is verl's (and grpo-replay's) code."""

    class CPUTrainer(base):
        def _init_tokenizer(self):
            self.tokenizer, self.processor = build_tokenizer(), None

        def _setup(self):
            self._init_tokenizer()
            self._init_dataloader()
            self._init_dump_executor()
            self.model = Bigram(len(self.tokenizer))
            self.actor_rollout_wg = FakeActorWG(self.config, self.model)
            self.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=[])
            self.checkpoint_manager = FakeCheckpointManager()
            if self.trainer_mode == "separate_async":  # hybrid_engine=false: only the standalone replicas
                from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

                self.standalone_checkpoint_manager = self.checkpoint_manager
                self.current_mode = HybridEngineMode.TRAINER
            self.resource_pool_manager = SimpleNamespace(get_n_gpus=lambda: 2)
            self.ref_in_actor, self.use_critic = False, False
            self.step_metrics: dict[int, dict] = {}
            self._load_checkpoint()

        def _update_actor(self, batch, metrics):
            out = super()._update_actor(batch, metrics)
            for rec in self.actor_rollout_wg.updates:
                rec["step"] = self.global_steps if rec["step"] is None else rec["step"]
            return out

        def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
            super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
            self.step_metrics[global_steps] = dict(metrics)
            self.names_used = getattr(self, "names_used", {})
            self.names_used[global_steps] = self.uid_names.n  # prompt names handed out by the end of this step

    return CPUTrainer


class CountingUUID:
    """Stands in for `uuid` in verl's trainer_base: uuid4() counts up from `start`. verl names each prompt group
    `uuid4()` and its async sampler breaks ties between equally old groups in set order, so two runs pick the same
    groups only when their names agree; a resumed run starts where the uninterrupted run stood at the checkpoint."""

    def __init__(self, start: int = 0):
        self.n = start

    def uuid4(self):
        import uuid

        self.n += 1
        return uuid.UUID(int=self.n)


def run_fit(cls: type, config, uid_start: int = 0, **agent) -> object:
    """verl's `fit()` of `cls` on CPU; `agent` goes to `FakeAgentLoop` (multi_output, fail, extras)."""
    import verl.trainer.ppo.v1.trainer_base as base

    real, base.uuid = base.uuid, CountingUUID(uid_start)
    try:
        trainer = cpu_trainer_cls(cls)(config=config)
        trainer.uid_names = base.uuid
        trainer.init()
        loop = FakeAgentLoop(config, trainer.tokenizer, trainer.model, trainer.checkpoint_manager, **agent)
        trainer.agent_loop = loop
        trainer.fit(loop)
    finally:
        base.uuid = real
    return trainer
