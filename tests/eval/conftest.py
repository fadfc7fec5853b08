import json
from pathlib import Path

import pytest

from grpo_replay.data import BENCHMARKS
from helpers import SHARED_DATA

SHARED_BENCH = SHARED_DATA / "benchmarks"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_model(path: Path, chat_template: bool = True) -> Path:
    """A randomly initialised 2-layer Qwen2 with a byte-level BPE tokenizer trained in memory (offline)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    specials = ["<|pad|>", "<|eos|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["The answer is \\boxed{42}.", "Find $x$ such that x+1=2.", "\\frac{1}{2}"] * 5, trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|pad|>")
    if chat_template:
        hf_tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(hf_tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    hf_tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def bench_dir(tmp_path_factory) -> Path:
    """The first 3 problems of each shared benchmark (or synthetic ones when the shared data is absent)."""
    out = tmp_path_factory.mktemp("bench")
    for name in BENCHMARKS:
        src = SHARED_BENCH / f"{name}.jsonl"
        if src.is_file():
            lines = src.read_text(encoding="utf-8").splitlines()[:3]
        else:
            lines = [json.dumps({"id": f"{name}-{i}", "problem": f"What is {i}+1?", "answer": str(i + 1),
                                 "source": "synthetic"}) for i in range(3)]
        (out / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out
