"""Check (c): `ReplayGRPOTrainer` for 2 steps on the device with a tiny random Qwen3 and TRL's transformers
generation (no vLLM), replay rows reaching the loss: the rows flagged as replayed in the inputs of TRL's loss are
counted, and the trainer's own logged replay count must be above 0 as well.

The prompts are strings of a small character vocabulary and the reward a hash of the completion's text, so that
groups have reward variance (their rows have non-zero advantages and enter the buffer) whatever the random model
writes.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from ... import metric_names as mn
from .report import Result

CHARS = "abcdefgh0123456789+="
WARMUP_STEPS = 1  # replay from step 2 of 2 on


def tokenizer():
    """A character-level fast tokenizer (one token per character; pad 0, eos 1; left padding, as TRL wants)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left")


def tiny_qwen3():
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(CHARS) + 2, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1, tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def reward(completions, **_):
    return [float(hashlib.md5(c.encode()).digest()[0] % 3) / 2.0 for c in completions]


def check(res: Result, out: Path, device: torch.device) -> None:
    from datasets import Dataset

    from ...integrations.trl import ReplayGRPOConfig, ReplayGRPOTrainer
    from ...integrations.trl.replay_grpo_trainer import REPLAY_FLAG_KEY
    from ...trainer.trl.backend import no_activation_checkpointing

    cuda = device.type == "cuda"
    args = ReplayGRPOConfig(
        output_dir=str(out), use_cpu=not cuda, bf16=cuda, **no_activation_checkpointing(), per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, max_steps=2, learning_rate=1e-2, report_to="none",
        save_strategy="no", logging_steps=1, seed=0, replay_preset="paper", replay_warmup_steps=WARMUP_STEPS,
        dataloader_num_workers=0, disable_tqdm=True)
    prompts = ["".join(CHARS[(i * 7 + j * 3) % 8] for j in range(2 + i % 3)) + "=" for i in range(32)]
    trainer = ReplayGRPOTrainer(model=tiny_qwen3(), reward_funcs=reward, args=args,
                                train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tokenizer())
    reached = {"replay": 0, "rows": 0}
    real_loss = trainer._compute_loss

    def counted(model, inputs):  # the rows TRL's split hands to the loss
        flag = inputs.get(REPLAY_FLAG_KEY)
        reached["rows"] += len(inputs["completion_ids"])
        reached["replay"] += int(flag.sum()) if flag is not None else 0
        return real_loss(model, inputs)

    trainer._compute_loss = counted
    trainer.train()
    where = {p.device.type for p in trainer.model.parameters()}
    logged = [h[mn.REPLAY_COUNT] for h in trainer.state.log_history if mn.REPLAY_COUNT in h]
    res.figures.update({
        "steps": trainer.state.global_step,
        "parameters on": ", ".join(sorted(where)),
        "rows reaching the loss (replayed among them)": f"{reached['rows']} ({reached['replay']})",
        f"logged {mn.REPLAY_COUNT} per step": logged,
        "losses": [round(h["loss"], 4) for h in trainer.state.log_history if "loss" in h],
    })
    if where != {device.type}:
        res.status, res.why = "failed", f"the model trained on {where}, not {device.type}"
    elif not reached["replay"] or not any(x > 0 for x in logged):
        res.status = "failed"
        res.why = (f"no replay row reached the loss ({reached['replay']} flagged rows in TRL's loss inputs, logged "
                   f"{mn.REPLAY_COUNT} {logged}) after a warm-up of {WARMUP_STEPS} step(s)")
