"""What the recipes' CPU twins share (the TRL examples' and the built-in recipe's): a tiny Qwen2
whose vocabulary holds `\\boxed{1}` and `\\boxed{2}` as single tokens, so the examples' own math reward
(`accuracy_reward`, math-verify) sees boxed answers from an untrained model and groups have reward variance; a local
dataset folder with the MATH fields the examples read (`problem`, `solution`)."""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples/trl"
ANSWERS = ("\\boxed{1}", "\\boxed{2}")
CHARS = "abc0123"


def make_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for t in (*ANSWERS, *CHARS):
        vocab[t] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\\boxed\{\d\}|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left")


def save_model(folder: Path, seed: int = 0) -> Path:
    """The tiny model and its tokenizer in a folder, as `model_name_or_path` names a checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(seed)
    tok = make_tokenizer()
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def save_dataset(folder: Path, n: int = 32) -> Path:
    """A local dataset `load_dataset(folder, split="train")` reads, with MATH-lighteval's fields."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"problem": f"What is {i % 2 + 1}?", "solution": f"It is {ANSWERS[i % 2]}."} for i in range(n)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder
