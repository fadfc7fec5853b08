"""Checkpoints: complete round trip, atomic writes, keep-last-N, no unpickling, disk full."""
import errno
import pickle
import random
import shutil

import numpy as np
import pytest
import torch
from helpers import make_batch, read_jsonl, without_times

from grpo_replay import ReplayBuffer
from grpo_replay.cli import main
from grpo_replay.config import ReplayConfig
from grpo_replay.trainer import checkpoint


def _parts(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    buf = ReplayBuffer(ReplayConfig(tau_max=5), seed=seed)
    return model, opt, sched, buf, np.random.default_rng(seed)


def _train_a_bit(model, opt, sched, buf, step):
    loss = model(input_ids=torch.randint(0, 50, (2, 6))).logits.square().mean()
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    buf.add(make_batch(seed=step), step)
    buf.sample(4, step + 1)


def _save(run_dir, step, parts, keep=2):
    model, opt, sched, buf, rng = parts
    return checkpoint.save(run_dir, step, model, None, opt, sched, buf, rng, {"generated": step, "initial_eval": None}, keep=keep)


def test_round_trip_restores_model_optimizer_scheduler_buffer_rngs_and_step(tmp_path):
    parts = _parts()
    model, opt, sched, buf, rng = parts
    for s in range(3):
        _train_a_bit(model, opt, sched, buf, s)
    rng.integers(0, 10, 5)
    random.random()
    _save(tmp_path, 3, parts)
    # what an uninterrupted run would draw next
    want = (torch.rand(3), rng.random(3), random.random(), buf.sample(4, 4).advantages, sched.get_last_lr())
    fresh = _parts(seed=1)
    state = checkpoint.load(checkpoint.latest(tmp_path), *fresh)
    model2, opt2, sched2, buf2, rng2 = fresh
    assert state["step"] == 3 and state["generated"] == 3
    for (n, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), n
    for sa, sb in zip(opt.state_dict()["state"].values(), opt2.state_dict()["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert sched2.state_dict() == sched.state_dict()
    got = (torch.rand(3), rng2.random(3), random.random(), buf2.sample(4, 4).advantages, sched2.get_last_lr())
    assert torch.equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]
    assert torch.equal(got[3], want[3]) and got[4] == want[4]
    assert buf2.stats(4) == buf.stats(4)


@pytest.mark.parametrize("where", ["model", "buffer", "state"])
def test_crash_during_write_leaves_previous_checkpoint(tmp_path, monkeypatch, where):
    parts = _parts()
    _train_a_bit(*parts[:4], 0)
    first = _save(tmp_path, 1, parts)
    _train_a_bit(*parts[:4], 1)

    def boom(*a, **k):
        raise RuntimeError("crash mid-write")

    target = {"model": (type(parts[0]), "save_pretrained"), "buffer": (ReplayBuffer, "save"),
              "state": (checkpoint, "_fsync_tree")}[where]
    monkeypatch.setattr(*target, boom)
    with pytest.raises(RuntimeError, match="crash mid-write"):
        _save(tmp_path, 2, parts)
    monkeypatch.undo()
    assert checkpoint.latest(tmp_path) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000001"]  # the partial ckpt-000002.tmp is gone
    assert checkpoint.load(first, *_parts(seed=1))["step"] == 1


def test_leftovers_of_a_kill_mid_write_are_ignored(tmp_path):
    """kill -9 skips the cleanup: a .tmp folder (or any folder without trainer_state.json) is never loaded."""
    parts = _parts()
    first = _save(tmp_path, 1, parts)
    shutil.copytree(first, tmp_path / "ckpt-000002.tmp")
    (tmp_path / "ckpt-000003").mkdir()
    (tmp_path / "ckpt-000003" / "optim.pt").write_bytes(b"\x80partial")
    assert checkpoint.latest(tmp_path) == first
    assert checkpoint.load(checkpoint.latest(tmp_path), *_parts(seed=1))["step"] == 1
    # the next save of step 2 replaces the stale .tmp folder
    assert _save(tmp_path, 2, parts).name == "ckpt-000002"


def test_keeps_the_last_n(tmp_path):
    parts = _parts()
    for s in range(1, 6):
        _save(tmp_path, s, parts, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt-000004", "ckpt-000005"]
    for s in range(6, 8):
        _save(tmp_path, s, parts, keep=3)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt-000005", "ckpt-000006", "ckpt-000007"]


def test_files_are_safetensors_json_npz_or_weights_only_torch(tmp_path, monkeypatch):
    parts = _parts()
    _train_a_bit(*parts[:4], 0)
    ck = _save(tmp_path, 1, parts)
    files = sorted(str(p.relative_to(ck)) for p in ck.rglob("*") if p.is_file())
    assert {f.rsplit(".", 1)[-1] for f in files} <= {"safetensors", "json", "npz", "pt"}, files
    loads, np_loads = [], []
    real_load, real_np_load = torch.load, np.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(k) or real_load(*a, **k))
    monkeypatch.setattr(np, "load", lambda *a, **k: np_loads.append(k) or real_np_load(*a, **k))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("pickle.loads called"))
    checkpoint.load(ck, *_parts(seed=1))
    assert len(loads) == 2 and all(k.get("weights_only") is True for k in loads)
    assert np_loads and all(k.get("allow_pickle") is False for k in np_loads)


class Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_checkpoint_holding_a_pickled_object_is_refused(tmp_path):
    parts = _parts()
    ck = _save(tmp_path, 1, parts)
    torch.save({"optimizer": Payload(), "scheduler": {}}, ck / "optim.pt")
    with pytest.raises(checkpoint.DamagedCheckpoint, match="optim.pt is damaged") as e:
        checkpoint.load(ck, *_parts(seed=1))
    assert isinstance(e.value.__cause__, pickle.UnpicklingError)  # refused by weights_only, never unpickled


def test_disk_full_while_checkpointing_stops_clearly_and_resume_works(reference_run, train_args, tmp_path, monkeypatch, capsys):
    """ENOSPC halfway through checkpoint 4 (model written, buffer not): exit 1 with a message naming the step
    and the intact checkpoint; once space is back the same command resumes and matches the reference run."""
    out = tmp_path / "run"
    real_save = ReplayBuffer.save
    calls = []

    def full_disk(self, path):
        calls.append(path)
        if len(calls) == 2:  # checkpoint_every=2: the checkpoint at step 4
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(self, path)

    monkeypatch.setattr(ReplayBuffer, "save", full_disk)
    assert main(train_args(out)) == 1
    err = capsys.readouterr().err
    assert "checkpoint at step 4 failed: No space left on device; previous checkpoint ckpt-000002 is intact" in err
    assert [p.name for p in out.iterdir() if p.name.startswith("ckpt-")] == ["ckpt-000002"]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4]
    monkeypatch.undo()
    assert main(train_args(out)) == 0
    assert without_times(read_jsonl(out / "metrics.jsonl")) == without_times(read_jsonl(reference_run / "metrics.jsonl"))
    assert read_jsonl(out / "evals.jsonl") == read_jsonl(reference_run / "evals.jsonl")
