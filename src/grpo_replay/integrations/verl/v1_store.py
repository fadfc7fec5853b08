"""Stored rollouts for verl's v1 trainer: the buffer keeps what it samples on, a row store keeps the rows.

A fresh row, once verl has given it its final `old_log_probs` and `advantages` (v1's `_update_actor`), is read
from TransferQueue and kept in a `RowStore` (row_store.py: a Ray actor of its own), in compact form
(row_codec.py) and without the fields verl's actor update never reads (UNREAD_FIELDS), with the few tags it
needs (KEPT_TAGS). The core `ReplayBuffer` holds each stored row payload-free (no token ids or log-probs: zero
width), with only the scalar columns it evicts and samples on (birth, advantage, reward, group std, group and prompt
keys, weight). A stored row's id is the buffer's own insertion number of the row (`ReplayBuffer.keys`; every
draw returns it as `buffer_seq`): the rows are deferred in the session when they are copied, which hands out their
numbers then (`ReplaySession.defer`), and enter the buffer at the global step's end (`flush`); a row the buffer
evicts, by any path, leaves the row store by its number (`ReplayBuffer.take_evicted`). A replayed row is rebuilt
bit for bit and put into the training partition under the key `grpo-replay-<id>` for the one update that reads it,
then cleared: between updates no stored row is in TransferQueue, so verl's sampler (which lists every key of every
partition on each poll) and verl's own TransferQueue checkpoints never hold one.

The key has no "_": verl's samplers group trajectory keys by `key.split("_")[0]`, the prompt uid, and sample only
groups whose prompt tag is terminal, so a replay row is never handed out as a fresh one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import torch

from ...advantage import group_advantages, nonzero_variance_mask
from ...buffer import ReplayBuffer
from ...config import ReplayConfig
from ...deferred import Deferred
from ...rollout import RolloutBatch
from ...session import ReplaySession
from ...step_plan import StepPlan
from .row_codec import unbind_rows
from .row_store import RowStore
from ...adapter_rows import prompt_key, row_advantages
from .settings import VerlReplaySettings, check_options

KEY_PREFIX = "grpo-replay-"
ID_KIND = "buffer_seq"
"""What a store key's number is: the buffer's insertion number of the row (saved in `.store.json`)."""
ROWS_KIND = "row_store"
"""Where the stored rows are saved: `<buffer path>.rows.pt`, the row store's file (saved in `.store.json`)."""
STORE_TAG = "grpo_replay"
"""Tag of a stored row: {"id", "of" (the fresh key it was copied from), "birth" (its generating version + 1),
"step" (the global step that trained on it fresh)}."""
KEPT_TAGS = ("seq_len", "prompt_len", "response_len")
"""Of the fresh row's tag, what a replay row carries (`_balance_batch` reads `seq_len`)."""
UNREAD_FIELDS = frozenset({"log_probs", "entropy", "returns", "values", "rm_scores", "token_level_scores",
                           "token_level_rewards", "rollout_log_probs", "dummy_tensor"})
"""Tensor fields of a fresh row that verl 0.9.1's actor update never reads (the loss takes log-probs and entropy
from its own forward pass; `returns` and `values` are the critic's; rewards and rollout log-probs were used up by
`_compute_advantage` and `_compute_old_log_prob`): not stored, and not handed to an update with replay rows."""
READ_OBJECTS = frozenset({"multi_modal_inputs"})
"""The one per-row non-tensor field the update reads; the others (uid, prompt and agent-loop fields) are not kept."""
READ_FIELDS = ("input_ids", "position_ids", "prompts", "responses", "response_mask", "loss_mask", "old_log_probs",
               "advantages", "rollout_is_weights", "ref_log_prob", "multi_modal_inputs", "routed_experts",
               "teacher_ids", "teacher_logprobs")
"""Fields verl 0.9.1's actor update reads when a row has them (model inputs; prompt and response lengths; the loss's
masks, log-probs, advantages and weights; router replay; distillation): a stored row always keeps these."""


def kept_field(name: str, value: Any) -> bool:
    """Whether a stored row keeps a field of its fresh row."""
    if name in READ_FIELDS:
        return True
    return name not in UNREAD_FIELDS and (isinstance(value, torch.Tensor) or name in READ_OBJECTS)


# Read from TransferQueue for each fresh row (transiently): what the buffer samples on.
SCALAR_FIELDS = ["prompts", "response_mask", "advantages", "rm_scores", "uid"]


def store_key(i: int) -> str:
    return f"{KEY_PREFIX}{int(i)}"


def is_store_key(key: str) -> bool:
    return key.startswith(KEY_PREFIX)


@dataclass
class FreshRows:
    """The non-padding rows of a v1 batch with the scalars the buffer needs (row i = keys[i])."""

    keys: list[str]
    tags: list[dict]
    rewards: torch.Tensor
    advantages: torch.Tensor
    group_ids: torch.Tensor
    prompt_keys: np.ndarray
    birth: np.ndarray
    """Birth step per row = the oldest weight version that generated it (`min_global_steps`) + 1, so that in sync
    mode a fresh row's birth is the global step that trains on it and age = step - birth counts versions."""

    def __len__(self) -> int:
        return len(self.keys)


def read_fresh(tq, keys: Sequence[str], tags: Sequence[dict], partition_id: str, global_steps: int) -> FreshRows:
    """Scalars of the fresh rows from TransferQueue (synthetic padding rows, tag `is_padding`, are left out)."""
    keep = [i for i, t in enumerate(tags) if not t.get("is_padding", False)]
    keys, tags = [keys[i] for i in keep], [tags[i] for i in keep]
    if not keys:
        empty = torch.zeros(0)
        return FreshRows([], [], empty, empty, empty.long(), np.zeros(0, np.int64), np.zeros(0, np.int64))
    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=SCALAR_FIELDS)
    prompts = list(data["prompts"].unbind())
    padded = data.select("response_mask", "advantages", "rm_scores").to_padded_tensor()
    mask = padded["response_mask"].long()
    advantages = row_advantages(padded["advantages"], mask)
    rewards = session_rewards(keys, padded["rm_scores"].float().sum(-1))
    _, inv = np.unique(np.asarray(list(data["uid"])).astype(str), return_inverse=True)
    versions = [t.get("min_global_steps") for t in tags]
    birth = np.array([(global_steps - 1 if v is None else int(v)) + 1 for v in versions], dtype=np.int64)
    return FreshRows(
        keys=list(keys),
        tags=list(tags),
        rewards=rewards,
        advantages=advantages,
        group_ids=torch.from_numpy(inv.astype(np.int64).reshape(-1)),
        prompt_keys=np.array([prompt_key(p) for p in prompts], dtype=np.int64),
        birth=birth,
    )


def session_rewards(keys: Sequence[str], rewards: torch.Tensor) -> torch.Tensor:
    """(B,) each row's reward as its session's final output's (key `{uid}_{session}_{index}`, highest index): an
    agent loop that emits several outputs per session scores the last one, and verl's GRPO advantage takes it
    from that output and broadcasts it to the session's other outputs, so the zero-variance filter does too."""
    final: dict[str, tuple[int, int]] = {}
    sessions = []
    for j, k in enumerate(keys):
        session, _, index = k.rpartition("_")
        sessions.append(session)
        if session not in final or final[session][0] < int(index):
            final[session] = (int(index), j)
    return rewards[torch.tensor([final[s][1] for s in sessions], dtype=torch.long)] if len(keys) else rewards


def payload_free_batch(fresh: FreshRows, rows: np.ndarray) -> RolloutBatch:
    """The buffer's view of fresh rows `rows`: their scalars, with zero-width token fields (the rows themselves
    go to the row store)."""
    n = len(rows)
    idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
    std = group_advantages(fresh.rewards, fresh.group_ids)[1] if n else torch.zeros(0)
    none = torch.zeros(n, 0, dtype=torch.long)
    batch = RolloutBatch.fresh(
        prompt_ids=none,
        prompt_mask=none,
        completion_ids=none,
        completion_mask=none,
        behaviour_logps=torch.zeros(n, 0),
        advantages=fresh.advantages[idx],
        rewards=fresh.rewards[idx],
        group_ids=fresh.group_ids[idx],
        group_std=std[idx],
        step=0,
    )
    batch.birth_step = torch.from_numpy(fresh.birth[np.asarray(rows, dtype=np.int64)].astype(np.int64))
    return batch


@dataclass
class V1Plan:
    """What one `compose` call decided: fresh rows used (indices into FreshRows) and stored rows replayed."""

    step: int
    fresh_used: np.ndarray
    replay_ids: np.ndarray
    replay_birth: np.ndarray
    replay_adv: np.ndarray
    nonzero: np.ndarray
    plan: Optional[StepPlan] = None  # the step plan's realised counts (its share is replay/share)
    metrics: dict[str, float] = field(default_factory=dict)


class TQReplayStore:
    """The core `ReplayBuffer` over rows kept in a `RowStore` (see the module docstring).

    `rows` is where the rows are kept: a `RowStore` in this process (the default, for tests and tools) or the
    trainer's `remote_row_store()`."""

    def __init__(self, config: Optional[ReplayConfig] = None, settings: Optional[VerlReplaySettings] = None,
                 rows: Any = None, engine_age_bound: Optional[int] = None):
        self.config = config or ReplayConfig()
        self.settings = settings or VerlReplaySettings()
        check_options(self.config, self.settings)
        # ages in versions, bounded by min(tau_max, verl's max_off_policy_threshold - 1) in the async modes
        self.session = ReplaySession(self.config, seed=self.settings.seed, engine_age_bound=engine_age_bound,
                                     report_evictions=True)
        self.rows = rows if rows is not None else RowStore()

    @property
    def buffer(self) -> ReplayBuffer:
        return self.session.buffer

    def live_ids(self) -> np.ndarray:
        """(n,) int64 ids of the rows the buffer holds (their insertion numbers), in slot order."""
        return self.buffer.keys()[0]

    def compose(self, fresh: FreshRows, step: int, unit: int = 1, n_pad: int = 0) -> V1Plan:
        """Algorithm 1 steps 3-6: zero-variance filter, evict by age, sample by priority, fitted to verl's `unit`
        (step_plan's one rule: replay rows, then spare rows, then the smallest-|A| fresh rows). The spare rows are
        the zero-variance rows the filter left out, then verl's `n_pad` padding rows (indices len(fresh) + j).
        `fresh_used` indexes the update's non-replay rows among the fresh rows and the padding rows."""
        n = len(fresh)
        nonzero = nonzero_variance_mask(fresh.rewards, fresh.group_ids).numpy() if n else np.zeros(0, bool)
        used = np.flatnonzero(nonzero) if self.settings.filter_zero_variance else np.arange(n)
        spare = np.concatenate([np.setdiff1d(np.flatnonzero(~nonzero), used), n + np.arange(n_pad)]).astype(np.int64)
        view = payload_free_batch(fresh, used)
        composed, kept, plan = self.session.compose(view, step, n_filtered=n - len(used), unit=unit,
                                                    spare=len(spare))  # n_filtered: for fill_filtered
        replay = composed.select(torch.nonzero(composed.is_replay).flatten())
        rows = np.arange(n + n_pad) if plan.whole else np.concatenate([used[kept.numpy()], spare[: plan.pad]])
        return V1Plan(
            step=step,
            fresh_used=rows.astype(np.int64),
            replay_ids=np.zeros(0, np.int64) if replay.buffer_seq is None else replay.buffer_seq.long().numpy(),
            replay_birth=replay.birth_step.long().numpy(),
            replay_adv=replay.advantages.float().numpy(),
            nonzero=nonzero,
            plan=plan,
        )

    def defer(self, fresh: FreshRows, rows: np.ndarray) -> Deferred:
        """Algorithm 1 step 7's first half: fresh rows `rows` wait in the session (by birth step, stable), their
        insertion numbers (`handle.seqs`, the row store's ids) handed out now; `flush` enters them."""
        rows = np.asarray(rows, dtype=np.int64)
        rows = rows[np.argsort(fresh.birth[rows], kind="stable")]
        return self.session.defer(payload_free_batch(fresh, rows), prompt_keys=fresh.prompt_keys[rows])

    def copy_rows(self, tq, fresh: FreshRows, rows: np.ndarray, partition_id: str, step: int) -> Deferred:
        """Keep fresh rows `rows` in the row store (every field the actor update reads, compact; of their tags
        KEPT_TAGS, plus STORE_TAG), each under the insertion number `defer` gives it; returns their handle. They
        must be copied before `fit()` clears the fresh keys; `flush` enters them into the buffer."""
        rows = np.asarray(rows, dtype=np.int64)
        rows = rows[np.argsort(fresh.birth[rows], kind="stable")]
        if not len(rows):
            return self.defer(fresh, rows)
        src = [fresh.keys[i] for i in rows]
        data = tq.kv_batch_get(keys=src, partition_id=partition_id)
        values = [{k: v for k, v in r.items() if kept_field(k, v)} for r in unbind_rows(data, len(src))]
        handle = self.defer(fresh, rows)
        tags = [
            {**{k: fresh.tags[i][k] for k in KEPT_TAGS if k in fresh.tags[i]},
             STORE_TAG: {"id": int(j), "of": fresh.keys[i], "birth": int(fresh.birth[i]), "step": int(step)}}
            for i, j in zip(rows, handle.seqs)
        ]
        self.rows.put(handle.seqs.tolist(), values, tags)
        return handle

    def flush(self) -> int:
        """Algorithm 1 step 7's second half: every waiting row enters the buffer (one add, birth order); the rows
        it left out or evicted leave the row store. Returns rows inserted."""
        n = self.session.flush()
        skipped = [d.skipped for d in self.session.flushed if len(d.skipped)]
        if skipped:
            self.rows.drop(np.concatenate(skipped).tolist())
        self.drop_evicted()
        return n

    def put_replay(self, tq, ids: np.ndarray, partition_id: str) -> tuple[list[str], list[dict], list[str]]:
        """Rebuild stored rows `ids` (in draw order; a draw with replacement may repeat one) and put each once into
        TransferQueue for one update: (their keys in `ids`' order, their tags, their fields). `take_back` clears
        them after the update; a put that fails clears what it registered."""
        if not len(ids):
            return [], [], []
        once = list(dict.fromkeys(int(i) for i in ids))
        values, tags = self.rows.get(once)
        fields = list(values[0])
        odd = [i for i, v in zip(once, values) if list(v) != fields]
        if odd:
            raise RuntimeError(f"stored rows {odd[:3]} hold other fields than stored row {once[0]} ({fields}): rows "
                               "stored under another config cannot be replayed together; resume with the config "
                               "that stored them, or with replay.allow_empty_resume=true and no buffer files")
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        keys = [store_key(i) for i in once]
        try:
            tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=list_of_dict_to_tensordict(values),
                            tags=tags)
        except BaseException:
            self.take_back(tq, keys, partition_id)
            raise
        tag_of = dict(zip(once, tags))
        return [store_key(i) for i in ids], [tag_of[int(i)] for i in ids], fields

    @staticmethod
    def take_back(tq, keys: Sequence[str], partition_id: str) -> None:
        if keys:
            tq.kv_clear(keys=list(dict.fromkeys(keys)), partition_id=partition_id)

    def drop_evicted(self) -> int:
        """Drop from the row store the rows the buffer evicted since the last call, by any path (age, capacity,
        max_uses, drift: `ReplayBuffer.take_evicted`)."""
        gone = self.buffer.take_evicted()
        return self.rows.drop(gone.tolist()) if len(gone) else 0

    # --- persistence: the buffer (scalars) and the row store, each in its own file -----------------------
    def save(self, path: str) -> None:
        self.buffer.save(path)
        self.rows.save(path + ".rows.pt")
        with open(path + ".store.json", "w") as f:
            json.dump({"key_prefix": KEY_PREFIX, "id": ID_KIND, "rows": ROWS_KIND}, f)

    def load(self, path: str) -> None:
        """Restore the buffer (the session's `load`) and its rows; a row copied but not yet added when `path` was
        saved is not in the buffer and is dropped (its number stays unused: ids continue from the buffer's
        `next_seq`)."""
        problem = saved_layout_problem(path)
        if problem:
            raise ValueError(problem)
        self.session.load(path)
        self.rows.load(path + ".rows.pt")
        live = self.buffer.keys()[0]
        missing = np.setdiff1d(live, self.rows.ids())
        if len(missing):
            raise FileNotFoundError(f"{path}.rows.pt: stored rows {missing[:3].tolist()} ({len(missing)}) of the "
                                    "buffer are not in it")
        self.rows.keep_only(live.tolist())

    def files(self, path: str) -> list[str]:
        return [path + s for s in SUFFIXES]

    @staticmethod
    def saved_layout_problem(path: str) -> Optional[str]:
        return saved_layout_problem(path)


SUFFIXES = (".json", ".npz", ".store.json", ".rows.pt")


def saved_layout_problem(path: str) -> Optional[str]:
    """Why the stored rows saved at `path` (its `.store.json`) cannot be resumed by this version, or None (also
    when there is no such file: the caller reports missing files)."""
    try:
        with open(path + ".store.json") as f:
            saved = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"{path}.store.json: not readable ({e})"
    if saved.get("id") == ID_KIND and saved.get("rows") == ROWS_KIND:
        return None
    return (f"{path}.store.json: this checkpoint keeps its stored rows in {saved.get('rows') or 'TransferQueue'}, "
            f"keyed by {saved.get('id') or 'a counter of the store'}; this version keeps them in its {ROWS_KIND} "
            f"keyed by {ID_KIND}. Resume with the grpo-replay version that saved it, or with "
            "replay.allow_empty_resume=true to start this run's buffer empty")

