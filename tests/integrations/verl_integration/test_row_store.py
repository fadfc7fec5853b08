"""The replay row store: compact rows rebuilt bit for bit, their bytes at the paper's lengths, their files."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl.protocol")

from grpo_replay.integrations.verl.row_codec import (  # noqa: E402
    decode_row, encode_row, encoded_nbytes, same_bytes, unbind_rows,
)
from grpo_replay.integrations.verl.row_store import RowStore  # noqa: E402
from grpo_replay.integrations.verl.v1_store import kept_field  # noqa: E402
from verl_batches import v1_row as verl_row  # noqa: E402


def test_every_field_is_rebuilt_bit_for_bit_and_in_compact_form():
    mask = torch.ones(40, dtype=torch.int64)
    mask[10:17] = 0  # a tool response inside a multi-turn completion
    for row in (verl_row(12, 40), verl_row(12, 40, mask=mask), verl_row(12, 40, adv=0.0), verl_row(1, 1)):
        enc = encode_row(row)
        back = decode_row(enc)
        assert list(back) == list(enc) and set(back) == set(row)
        for k in row:
            assert same_bytes(back[k], row[k]), k
    enc = encode_row(verl_row(12, 40, mask=mask))
    forms = {k: v[0] for k, v in enc.items()}
    assert forms["position_ids"] == "arange" and forms["loss_mask"] == "bits"
    assert forms["prompts"] == forms["responses"] == "slice" and forms["input_ids"] == "narrow"
    assert forms["response_mask"] == "bits" and forms["advantages"] == "masked_const"
    assert forms["old_log_probs"] == "raw"


def test_what_fits_no_form_is_kept_whole():
    row = verl_row(4, 8)
    row["input_ids"] = row["input_ids"] + 2**40  # ids beyond int32
    row["old_log_probs"][3] = float("nan")
    row["position_ids"] = torch.stack([torch.arange(12)] * 3)  # multi-modal rope positions (3, L)
    row["advantages"] = torch.linspace(-1, 1, 8)  # varies over the response: no single value
    row["multi_modal_inputs"] = {"pixel_values": torch.randn(3, 4).to(torch.bfloat16)}
    back = decode_row(encode_row(row))
    for k in row:
        assert same_bytes(back[k], row[k]), k
    assert encode_row(row)["input_ids"][0] == "raw"
    # signed zeros are bytes too: a negative advantage times a 0 mask is -0.0, as verl computes it
    neg = verl_row(4, 8, adv=-1.0, mask=torch.tensor([1, 0, 1, 1, 0, 1, 1, 1]))
    assert torch.signbit(neg["advantages"][1]) and same_bytes(decode_row(encode_row(neg))["advantages"],
                                                             neg["advantages"])
    assert not same_bytes(torch.tensor([-0.0]), torch.tensor([0.0]))


def test_a_stored_row_at_the_papers_lengths_is_at_most_40_kb():
    p, r = 1024, 4096
    row = {k: v for k, v in verl_row(p, r).items() if kept_field(k, v)}
    assert sorted(row) == ["advantages", "input_ids", "loss_mask", "multi_modal_inputs", "old_log_probs",
                           "position_ids", "prompts", "response_mask", "responses"]
    whole = sum(v.numel() * v.element_size() for v in verl_row(p, r).values() if isinstance(v, torch.Tensor))
    kept = encoded_nbytes(encode_row(row))
    print(f"stored row at P={p}, R={r}: {kept} B kept of {whole} B in TransferQueue ({whole / kept:.1f}x)")
    assert kept <= 40_000
    assert kept >= 4 * (p + r) + 4 * r  # token ids as int32 and float32 old log-probs at least: nothing lost


def test_rows_of_a_transfer_queue_batch_and_the_store_files(tmp_path):
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    rows = [verl_row(3 + i, 5 + 2 * i, seed=i) for i in range(3)]
    data = list_of_dict_to_tensordict([dict(r) for r in rows])
    split = unbind_rows(data, 3)
    for a, b in zip(split, rows):
        for k in b:
            assert same_bytes(a[k], b[k]), k
    store = RowStore()
    nbytes = store.put([5, 6, 7], split, [{"seq_len": len(r["input_ids"])} for r in rows])
    assert nbytes == store.nbytes() > 0
    store.save(str(tmp_path / "rows.pt"))
    assert store.drop([6, 99]) == 1 and store.ids().tolist() == [5, 7]
    with pytest.raises(KeyError, match=r"stored rows \[6\] \(1\) are not in the replay row store"):
        store.get([5, 6])
    again = RowStore()
    assert again.load(str(tmp_path / "rows.pt")) == 3 and again.nbytes() == nbytes
    got, tags = again.get([7, 5])
    assert tags == [{"seq_len": 14}, {"seq_len": 8}]
    assert all(same_bytes(got[0][k], rows[2][k]) for k in rows[2])
    assert again.keep_only([7]) == 2 and again.ids().tolist() == [7]
    raw = (tmp_path / "rows.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=r"cut\.pt: not a readable replay row file"):
        RowStore().load(str(tmp_path / "cut.pt"))
    import pickle

    (tmp_path / "other.pt").write_bytes(pickle.dumps({"format": 99}))
    with pytest.raises(ValueError, match=r"other\.pt: replay row file format 99, this version reads 1"):
        RowStore().load(str(tmp_path / "other.pt"))


def test_an_update_with_replay_rows_reads_the_fields_they_were_stored_with():
    pytest.importorskip("transfer_queue")
    from grpo_replay.integrations.verl.trainer_v1 import update_fields

    stored = ["input_ids", "prompts", "responses", "response_mask", "old_log_probs", "advantages"]
    asked = [*stored, "uid", "rm_scores", "rollout_log_probs", "log_probs"]  # as verl's batch names them
    assert update_fields(asked, stored) == stored
    assert update_fields(None, stored) == stored
    with pytest.raises(RuntimeError, match=r"without the fields \['ref_log_prob'\] this update reads"):
        update_fields([*asked, "ref_log_prob"], stored)


def test_a_saved_store_resumes_with_exactly_its_buffers_rows(tmp_path):
    import numpy as np

    from grpo_replay.config import ReplayConfig
    from grpo_replay.integrations.verl.v1_store import FreshRows, TQReplayStore

    n = 8
    fresh = FreshRows(keys=[f"u{i // 4}_{i % 4}_0" for i in range(n)], tags=[{}] * n,
                      rewards=torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0]), advantages=torch.randn(n),
                      group_ids=torch.arange(n) // 4, prompt_keys=np.arange(n, dtype=np.int64),
                      birth=np.ones(n, dtype=np.int64))
    store = TQReplayStore(ReplayConfig.paper())
    ids = store.defer(fresh, np.arange(n)).seqs
    store.rows.put(ids.tolist(), [verl_row(3, 4, seed=i) for i in range(n)], [{"seq_len": 7}] * n)
    store.flush()
    late = store.defer(fresh, np.arange(1)).seqs  # copied, never added to the buffer
    store.rows.put(late.tolist(), [verl_row(3, 4, seed=n)], [{"seq_len": 7}])
    path = str(tmp_path / "replay_buffer")
    store.save(path)
    again = TQReplayStore(ReplayConfig.paper())
    again.load(path)
    assert again.rows.ids().tolist() == list(range(n)) and late.tolist() == [n]  # the unadded row is dropped
    assert again.buffer.next_seq == n + 1 and not again.session.pending  # its number stays unused
    rows, tags = again.rows.get([3])
    assert same_bytes(rows[0]["old_log_probs"], verl_row(3, 4, seed=3)["old_log_probs"]) and tags == [{"seq_len": 7}]
    store.rows.drop([5])
    store.save(path)
    with pytest.raises(FileNotFoundError, match=r"rows\.pt: stored rows \[5\] \(1\) of the buffer are not in it"):
        TQReplayStore(ReplayConfig.paper()).load(path)


def test_packed_rows_keep_every_dtype_and_object():
    import numpy as np

    row = {"input_ids": torch.tensor([5, 9, 2**40]), "flags": torch.tensor([True, False, True]),
           "half": torch.randn(4).to(torch.bfloat16), "small": torch.tensor([-3, 4], dtype=torch.int8),
           "bytes": torch.tensor([0, 255, 7], dtype=torch.uint8), "scalar": torch.tensor(2.5),
           "empty": torch.zeros(0, 3), "mask_bits": torch.tensor([1, 0, 0, 1, 1], dtype=torch.int64),
           "multi_modal_inputs": {"pixel_values": torch.randn(2, 2), "grid": np.array([[1, 2, 2]]),
                                  "names": np.array(["a", None], dtype=object)}}
    store = RowStore()
    held = store.put([1], [row], [{"seq_len": 3}])
    assert held == store.nbytes() == len(store.get_packed([1])[0])
    back = store.get([1])[0][0]
    for k in row:
        if k == "multi_modal_inputs":
            assert same_bytes(back[k]["pixel_values"], row[k]["pixel_values"])
            assert np.array_equal(back[k]["grid"], row[k]["grid"]) and list(back[k]["names"]) == ["a", None]
        else:
            assert same_bytes(back[k], row[k]), k


def test_the_row_store_drops_exactly_the_rows_the_buffer_reports_evicted():
    """Capacity at the flush, age and max_uses at a draw, drift: each eviction path's rows leave the row store, and
    only they (the buffer reports them; nothing is reconciled by set difference)."""
    import numpy as np

    from grpo_replay.config import ReplayConfig
    from grpo_replay.integrations.verl.v1_store import FreshRows, TQReplayStore

    def fresh(t: int, n: int = 8) -> FreshRows:
        return FreshRows(keys=[f"u{t}x{i // 4}_{i % 4}_0" for i in range(n)], tags=[{}] * n,
                         rewards=torch.tensor([1.0, 0, 0, 1] * (n // 4)), advantages=torch.linspace(-1, 1, n),
                         group_ids=torch.arange(n) // 4, prompt_keys=np.arange(n, dtype=np.int64),
                         birth=np.full(n, t, dtype=np.int64))

    store = TQReplayStore(ReplayConfig(warmup_steps=0, tau_max=1, capacity=12, max_uses=1, replacement=False))

    def stage(t: int) -> None:  # what copy_rows does, without TransferQueue
        f = fresh(t)
        ids = store.defer(f, np.arange(len(f))).seqs
        store.rows.put(ids.tolist(), [verl_row(3, 4, seed=int(i)) for i in ids], [{"seq_len": 7}] * len(ids))

    def in_step() -> bool:
        return store.rows.ids().tolist() == sorted(store.live_ids().tolist())

    stage(1)
    assert store.flush() == 8 and in_step()
    stage(2)
    assert store.flush() == 8 and len(store.buffer) == 12 and in_step()  # capacity: the 4 oldest rows left
    plan = store.compose(fresh(3), 3)  # age: rows born at 1 leave; max_uses 1: every drawn row leaves
    assert len(plan.replay_ids) and store.buffer.total_evicted_age and store.buffer.total_evicted_uses
    assert set(plan.replay_ids.tolist()) <= set(store.rows.ids().tolist())  # drawn rows are read before the drop
    assert store.drop_evicted() > 0 and in_step()
    live = store.live_ids()
    store.session.evict_drifted(live[:1])  # drift
    assert store.drop_evicted() == 1 and in_step() and store.drop_evicted() == 0
