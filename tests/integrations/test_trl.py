"""ReplayGRPOTrainer through real `trainer.train()` runs: tiny Qwen2 built from a config, char tokenizer, CPU.

Also usable as the worker script of the 2-process test: `accelerate launch test_trl.py --worker OUT_DIR`.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

trl = pytest.importorskip("trl") if __name__ != "__main__" else __import__("trl")
import torch  # noqa: E402

from grpo_replay.trainer.trl.backend import no_activation_checkpointing  # noqa: E402

CHARS = "abcdefgh0123456789+="


def make_tokenizer():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1}
    for c in CHARS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left")


def make_model(seed: int = 0):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(CHARS) + 2, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1, bos_token_id=1, tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(cfg)


def make_dataset(n: int = 64):
    from datasets import Dataset

    prompts = ["".join(CHARS[(i * 7 + j * 3) % 8] for j in range(2 + i % 3)) + "=" for i in range(n)]
    return Dataset.from_dict({"prompt": prompts})


def reward_fn(completions, **kwargs):
    """Deterministic in the completion text, varied enough that most groups have variance."""
    return [float(hashlib.md5(c.encode()).digest()[0] % 3) / 2.0 for c in completions]


def trl_kwargs(output_dir, **kw):
    base = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, **no_activation_checkpointing(),
        per_device_train_batch_size=4, num_generations=4, max_completion_length=6, max_steps=3,
        learning_rate=1e-2, report_to="none", save_strategy="no", logging_steps=1, seed=0,
        replay_warmup_steps=1, dataloader_num_workers=0, disable_tqdm=True,
    )
    base.update(kw)
    return base


def make_trainer(output_dir, cls=None, seed=0, model=None, **kw):
    from grpo_replay.integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer

    cls = cls or ReplayGRPOTrainer
    kwargs = trl_kwargs(output_dir, seed=seed, **kw)
    if cls is ReplayGRPOTrainer:
        args = ReplayGRPOConfig(**kwargs)
    else:  # plain GRPOTrainer: a plain GRPOConfig with the same settings
        args = trl.GRPOConfig(**{k: v for k, v in kwargs.items() if not k.startswith("replay_")})
    return cls(model=model if model is not None else make_model(seed), reward_funcs=reward_fn, args=args, train_dataset=make_dataset(),
               processing_class=make_tokenizer())


if __name__ == "__main__" and "--smoke" in sys.argv:
    import tempfile
    t = make_trainer(tempfile.mkdtemp(), replay_preset="paper")
    t.train()
    for h in t.replay_history:
        print({k: v for k, v in h.items() if k != "replay_completion_ids"})
    for row in t.state.log_history:
        print({k: v for k, v in row.items() if "replay" in k or "fresh" in k or k in ("loss", "step")})


# --------------------------------------------------------------------------------------------------------
def _param_vector(model) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])


def _train(tmp_path, **kw):
    trainer = make_trainer(tmp_path, **kw)
    if "model" in kw:  # loaded by path: no float64/bf16 surprises on CPU
        assert trainer.model.dtype == torch.float32
    before = _param_vector(trainer.model).clone()
    trainer.train()
    return trainer, before


def _logged(trainer, key):
    return [row[key] for row in trainer.state.log_history if key in row]


def test_config_parsed_by_trl_parser_yaml_and_cli(tmp_path):
    from trl import TrlParser

    from grpo_replay import ReplayConfig
    from grpo_replay.integrations.trl import ReplayGRPOConfig

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"output_dir: {tmp_path}\nreplay_preset: paper\nreplay_tau_max: 5\nreplay_ratio: 0.25\n"
        "replay_priority: uniform\nlearning_rate: 1.0e-6\nuse_cpu: true\nbf16: false\n"
    )
    (args,) = TrlParser((ReplayGRPOConfig,)).parse_args_and_config(
        ["--config", str(cfg), "--replay_alpha", "0.7", "--replay_capacity", "-1", "--replay_warmup_steps", "3"]
    )
    assert isinstance(args, ReplayGRPOConfig)
    assert args.learning_rate == 1e-6
    rc = args.to_replay_config()
    assert rc == ReplayConfig.paper(tau_max=5, replay_ratio=0.25, priority="uniform", alpha=0.7, capacity=None,
                                    warmup_steps=3)
    (args2,) = TrlParser((ReplayGRPOConfig,)).parse_args_and_config(
        ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false", "--replay_preset", "sigma_pool",
         "--replay_tau_max", "-1"]
    )
    assert args2.to_replay_config() == ReplayConfig.sigma_pool(tau_max=None)
    with pytest.raises(ValueError, match="preset"):
        ReplayGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, replay_preset="nope")
    with pytest.raises(ValueError, match="replay_ratio"):
        ReplayGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, replay_ratio=-1.0)


def test_unsupported_trl_version_fails_clearly(monkeypatch):
    import grpo_replay.integrations.trl as integ

    monkeypatch.setattr(trl, "__version__", "1.17.0")
    monkeypatch.delenv("GRPO_REPLAY_ALLOW_UNSUPPORTED_TRL", raising=False)
    with pytest.raises(ImportError, match=r"supports trl>=1\.16\.0,<1\.17, found trl==1\.17\.0"):
        integ._check_trl_version()
    monkeypatch.setenv("GRPO_REPLAY_ALLOW_UNSUPPORTED_TRL", "1")
    with pytest.warns(UserWarning, match="own risk"):
        integ._check_trl_version()


@pytest.mark.parametrize("preset", ["paper", "grpo", "uniform_pool", "sigma_pool"])
def test_train_each_preset(tmp_path, preset):
    # pool: two fresh groups of 4 and replay_ratio 1 give a share of 1/2 = exactly one whole replayed group (with
    # one fresh group, no whole group fits in the share of a pool: it would displace every fresh row).
    pool = dict(per_device_train_batch_size=8, replay_ratio=1.0) if "pool" in preset else {}
    trainer, before = _train(tmp_path, replay_preset=preset, max_steps=3, **pool)
    hist = list(trainer.replay_history)
    assert not torch.equal(before, _param_vector(trainer.model)), "parameters did not change"
    shares = _logged(trainer, "replay/share")
    assert len(shares) == 3
    if preset == "grpo":
        assert hist == [] and len(trainer.replay_buffer) == 0
        assert shares == [0.0, 0.0, 0.0]
        return
    assert [h["step"] for h in hist] == [0, 1, 2]
    assert hist[0]["replay_rows"] == 0, "replay during warm-up"
    assert all(h["replay_rows"] > 0 for h in hist[1:]), hist
    assert shares[0] == 0.0 and all(s > 0 for s in shares[1:])
    assert len(trainer.replay_buffer) > 0 and _logged(trainer, "buffer/size")[-1] > 0
    assert all(b < h["step"] for h in hist for b in h["replay_birth_steps"])  # replay rows are from earlier steps
    assert _logged(trainer, "replay/age_mean") and _logged(trainer, "replay/clip_frac")
    assert _logged(trainer, "fresh/clip_frac")
    n = 4  # fresh rows per step
    if preset == "paper":  # fresh-anchored: every fresh row + round(0.5 * 4) replay rows
        assert all(h["fresh_rows"] == n for h in hist)
        assert [h["replay_rows"] for h in hist[1:]] == [2, 2]
    else:  # pool: replay rows displace fresh rows, the total stays 2n, one whole group of replay rows
        assert all(h["fresh_rows"] + h["replay_rows"] == 2 * n for h in hist)
        assert [h["replay_rows"] for h in hist[1:]] == [4, 4]


def test_replay_disabled_matches_grpo_trainer(tmp_path):
    from grpo_replay.integrations.trl import ReplayGRPOTrainer

    ours, _ = _train(tmp_path / "a", replay_preset="grpo", max_steps=3, seed=1)
    plain, _ = _train(tmp_path / "b", cls=trl.GRPOTrainer, max_steps=3, seed=1)
    assert isinstance(ours, ReplayGRPOTrainer) and type(plain) is trl.GRPOTrainer
    assert len(_logged(ours, "loss")) == 3
    assert _logged(ours, "loss") == _logged(plain, "loss")
    assert torch.equal(_param_vector(ours.model), _param_vector(plain.model))


def test_steps_per_generation_and_reference_logps(tmp_path):
    """steps_per_generation=2 with a replay count it divides (round(0.25 * 8) = 2 rows, one per micro-batch), and
    beta != 0 so that reference log-probs must be filled for replay rows."""
    make_model(0).save_pretrained(tmp_path / "model")  # beta != 0: TRL loads the reference model by path
    trainer, before = _train(
        tmp_path / "run", model=str(tmp_path / "model"), replay_preset="paper", replay_ratio=0.25,
        gradient_accumulation_steps=2, beta=0.04, max_steps=3,
    )
    hist = list(trainer.replay_history)
    assert all(h["fresh_rows"] == 8 for h in hist)
    assert [h["replay_rows"] for h in hist] == [0, 2, 2]
    assert _logged(trainer, "kl")
    assert not torch.equal(before, _param_vector(trainer.model))


@pytest.mark.parametrize("per_device,spg,ratio,replay", [(3, 2, 0.5, 2), (3, 4, 0.5, 4), (4, 2, 0.375, 2)])
def test_a_split_that_does_not_hold_the_planned_replay_rows_trains_the_nearest_count(tmp_path, per_device, spg, ratio,
                                                                                    replay):
    """TRL splits a process's composed rows into steps_per_generation micro-batches. Where the planned replay rows do
    not fill whole micro-batches (TRL's common per-device 3 x steps_per_generation 2: 6 fresh + 3 replay rows), the
    trainer trains the replay count the split holds nearest to the ratio (6 + 2; ties: the fewer), as the plan says."""
    from grpo_replay.step_plan import plan_step

    trainer, _ = _train(tmp_path, replay_preset="paper", replay_ratio=ratio, per_device_train_batch_size=per_device,
                        steps_per_generation=spg, gradient_accumulation_steps=spg, max_steps=4,
                        num_generations=2 if per_device < 4 else 4)
    plan = plan_step(per_device * spg, trainer.replay_config, spg, group_size=trainer.num_generations)
    assert plan.replay == replay and trainer.replay_share == plan
    hist = list(trainer.replay_history)
    n = per_device * spg
    assert hist[0]["replay_rows"] == 0 and all(h["fresh_rows"] == n for h in hist)  # warm-up, fresh never cut here
    # a short buffer (step 1 holds only step 0's rows) trains fewer, not none, still in whole micro-batches
    assert all(0 < h["replay_rows"] <= replay and (n + h["replay_rows"]) % spg == 0 for h in hist[1:]), hist
    assert hist[-1]["replay_rows"] == replay, hist  # a buffer that holds them: the plan's count
    assert _logged(trainer, "replay/share")[-1] == pytest.approx(plan.share)


@pytest.mark.parametrize("spg,ratio", [(2, 0.2), (8, 0.5)])
def test_a_split_under_which_replay_would_vanish_is_refused_at_construction(tmp_path, spg, ratio):
    """Two fresh rows per process at ratio 0.2 plan round(0.4) = 0 replay rows; one-row micro-batches at ratio 0.5
    hold 0 or twice the ratio (the nearer on a tie: 0). The replay arm would be GRPO, so the trainer refuses at
    construction, naming the fields and settings under which replay trains."""
    from grpo_replay.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        make_trainer(tmp_path, replay_preset="paper", replay_ratio=ratio, per_device_train_batch_size=1,
                     steps_per_generation=spg, gradient_accumulation_steps=spg, num_generations=2)
    msg = str(e.value)
    assert f"per_device_train_batch_size=1 x steps_per_generation={spg}" in msg and "would train no replay row" in msg
    assert "allowed:" in msg


def test_resume_restores_buffer_and_draws(tmp_path):
    from grpo_replay import ReplayBuffer

    kw = dict(replay_preset="paper", max_steps=4, save_strategy="steps", save_steps=2, replay_tau_max=5)
    full, _ = _train(tmp_path / "full", **kw)
    ckpt = tmp_path / "full" / "checkpoint-2"
    assert (ckpt / "replay_buffer_rank0.npz").exists() and (ckpt / "replay_buffer_rank0.json").exists()
    saved = ReplayBuffer.load(ckpt / "replay_buffer_rank0")
    assert len(saved) == list(full.replay_history)[1]["buffer_size"]

    resumed = make_trainer(tmp_path / "resumed", **kw)
    resumed.train(resume_from_checkpoint=str(ckpt))
    a = [h for h in full.replay_history if h["step"] >= 2]
    b = list(resumed.replay_history)
    assert [h["step"] for h in b] == [2, 3]
    # The first draw after resuming depends only on the restored buffer (contents + generator state).
    for key in ("replay_birth_steps", "replay_advantages", "replay_completion_ids", "buffer_size"):
        assert a[0][key] == b[0][key], key
    assert a == b  # and, with the restored RNG state, every later draw as well


def test_merge_fills_optional_keys(tmp_path):
    """tool_mask, vLLM sampling log-probs and importance ratios are filled (and padded) for replay rows."""
    from grpo_replay import RolloutBatch
    from grpo_replay.integrations.trl.merge_rows import merge_replay

    trainer = make_trainer(tmp_path)
    B, C = 2, 4
    out = {
        "prompt_ids": torch.tensor([[0, 5, 6], [7, 8, 9]]),
        "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        "completion_ids": torch.tensor([[5, 6, 7, 0], [5, 1, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
        "tool_mask": torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]),
        "sampling_per_token_logps": -torch.ones(B, C),
        "importance_sampling_ratio": torch.full((B, C), 0.5),
        "old_per_token_logps": -2 * torch.ones(B, C),
        "advantages": torch.tensor([1.0, -1.0]),
        "num_items_in_batch": torch.tensor(5),
    }
    replay = RolloutBatch(
        prompt_ids=torch.tensor([[3, 4, 5, 6]]), prompt_mask=torch.ones(1, 4, dtype=torch.long),
        completion_ids=torch.tensor([[9, 9, 9, 9, 9]]), completion_mask=torch.tensor([[1, 0, 1, 1, 0]]),
        behaviour_logps=-3 * torch.ones(1, 5), advantages=torch.tensor([2.0]), rewards=torch.tensor([1.0]),
        group_ids=torch.tensor([0]), group_std=torch.tensor([0.5]), birth_step=torch.tensor([0]),
        is_replay=torch.tensor([True]),
    )
    trainer.vllm_importance_sampling_mode = "token_truncate"
    merged = merge_replay(trainer, out, torch.tensor([1]), replay)
    assert merged["prompt_ids"].shape == (2, 4) and merged["completion_ids"].shape == (2, 5)
    assert merged["prompt_mask"].tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert merged["completion_mask"].tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]  # attention up to length
    assert merged["tool_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 0, 1, 1, 1]]  # loss mask restored
    assert merged["old_per_token_logps"][1, :4].tolist() == [-3.0] * 4
    assert merged["sampling_per_token_logps"][1, :4].tolist() == [-3.0] * 4
    assert merged["importance_sampling_ratio"].tolist() == [[0.5] * 4 + [1.0], [1.0] * 5]
    assert merged["advantages"].tolist() == [-1.0, 2.0]
    trainer.vllm_importance_sampling_mode = "sequence_mask"  # sequence-level ratios are (B, 1)
    out["importance_sampling_ratio"] = torch.full((B, 1), 0.5)
    merged = merge_replay(trainer, out, torch.tensor([0, 1]), replay)
    assert merged["importance_sampling_ratio"].tolist() == [[0.5], [0.5], [1.0]]
    trainer.pad_to_multiple_of = 4  # TRL pads the fresh rows to multiples; the merged widths (4, 5) must follow
    merged = merge_replay(trainer, out, torch.tensor([0, 1]), replay)
    assert merged["prompt_ids"].shape == (3, 4) and merged["completion_ids"].shape == (3, 8)
    assert merged["prompt_mask"][2].tolist() == [1, 1, 1, 1]
    assert merged["completion_mask"][2].tolist() == [1] * 4 + [0] * 4
    assert merged["tool_mask"].shape == (3, 8) and merged["tool_mask"][:, 5:].eq(1).all()


# --------------------------------------------------------------------------------------------------------
def _worker(out_dir: str) -> None:
    from accelerate import PartialState

    state = PartialState()

    def reward_worker(completions, trainer_state, **kwargs):
        # Process 1's group has zero variance at step 0, so its buffer stays empty one step longer than
        # process 0's: both must then agree on 0 replay rows at step 1.
        if state.process_index == 1 and trainer_state.global_step == 0:
            return [1.0] * len(completions)
        return reward_fn(completions)

    trainer = make_trainer(out_dir, replay_preset="paper", max_steps=3)
    trainer.reward_funcs = [reward_worker]
    before = _param_vector(trainer.model).clone()
    trainer.train()
    after = _param_vector(trainer.model)
    rec = {
        "world": state.num_processes,
        "history": [{k: v for k, v in h.items() if k != "replay_completion_ids"} for h in trainer.replay_history],
        "changed": not torch.equal(before, after),
        "params": after.tolist(),
        "buffer": len(trainer.replay_buffer),
        "share": _logged(trainer, "replay/share"),
        "loss": _logged(trainer, "loss"),
        "fresh_abs_adv": _logged(trainer, "fresh/abs_adv"),
        "replay_abs_adv": _logged(trainer, "replay/abs_adv"),
    }
    Path(out_dir, f"rank{state.process_index}.json").write_text(json.dumps(rec))


@pytest.mark.slow
def test_two_processes_accelerate_gloo(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on a machine without GPUs runs torchrun with gloo
    (`--cpu` would fall back to a single process); the TRL config has use_cpu=True."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--multi_gpu", "--main_process_port", str(port),
           __file__, "--worker", str(tmp_path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r0, r1 = (json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2))
    assert r0["world"] == r1["world"] == 2
    assert r0["changed"] and r1["changed"]
    assert r0["params"] == r1["params"], "processes drifted apart"
    rows0 = [(h["step"], h["fresh_rows"], h["replay_rows"]) for h in r0["history"]]
    rows1 = [(h["step"], h["fresh_rows"], h["replay_rows"]) for h in r1["history"]]
    # Equal per-process row counts every step: at step 1 process 1 has nothing to replay, so neither does 0.
    assert rows0 == rows1 == [(0, 4, 0), (1, 4, 0), (2, 4, 2)]
    assert [h["inserted"] for h in r0["history"]] == [4, 4, 4]
    assert [h["inserted"] for h in r1["history"]] == [0, 4, 4]  # zero-variance group never enters the buffer
    assert r0["share"] == r1["share"] == [0.0, 0.0, pytest.approx(1 / 3)]
    assert r0["loss"] == r1["loss"]
    assert r0["buffer"] == 12 and r1["buffer"] == 8
    # |A| means are over both processes' rows, like every other replay/* metric.
    for s in range(3):
        rows = [abs(a) for r in (r0, r1) for a in r["history"][s]["fresh_advantages"]]
        assert r0["fresh_abs_adv"][s] == r1["fresh_abs_adv"][s] == pytest.approx(sum(rows) / len(rows))
    rep = [abs(a) for r in (r0, r1) for a in r["history"][2]["replay_advantages"]]
    assert r0["replay_abs_adv"] == r1["replay_abs_adv"] == [pytest.approx(sum(rep) / len(rep))]


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker(sys.argv[sys.argv.index("--worker") + 1])
