"""Character-level ``PreTrainedTokenizerFast`` for the testbed."""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, BOS, UNK)
#: Every non-special symbol of the task: digits, operators, scratchpad brackets.
CHARS = "0123456789+=[]"


def build_tokenizer(chars: str = CHARS) -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer (ids: pad=0, eos=1, bos=2, unk=3, then ``chars``).

    Encoding a text adds ``<bos>`` in front (``add_special_tokens=False`` to skip it); decoding
    joins characters without spaces.  ``padding_side`` is ``"left"`` (for batched prompts).
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for c in chars:
        if c not in vocab:
            vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # every character is its own pre-token (special tokens are matched before this runs)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    return fast


__all__ = ["build_tokenizer", "PAD", "EOS", "BOS", "UNK", "CHARS", "SPECIAL_TOKENS"]
