"""A model's shape without its weights: the memory estimate needs only config-level facts.

Hub names the docs' recipes use map to their config.json values here (`KNOWN`), so a preflight on a machine
without the hub still estimates them; a local folder's config.json (or a GGUF file's metadata) is read as it is,
and another hub name's from the local Hugging Face cache (`$HF_HUB_CACHE`, `$HF_HOME/hub` or
~/.cache/huggingface/hub, where a download or `hf download ORG/NAME config.json` puts it); the embedded testbed's
shape comes from its config. Anything else has no shape: the preflight refuses it as "memory unknown" (nothing is
downloaded).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from ..trainer.memory import Shape

# config.json of the Qwen3 dense models (hidden, intermediate, layers, heads, kv heads, head_dim, tied embeddings);
# the Base and post-trained checkpoints share their shapes. vocab 151,936.
_QWEN3 = {
    "0.6B": (1024, 3072, 28, 16, 8, 128, True),
    "1.7B": (2048, 6144, 28, 16, 8, 128, True),
    "4B": (2560, 9728, 36, 32, 8, 128, True),
    "8B": (4096, 12288, 36, 32, 8, 128, False),
}
KNOWN = {
    f"Qwen/Qwen3-{size}{suffix}": dict(hidden_size=h, intermediate_size=i, num_hidden_layers=n, num_attention_heads=q,
                                       num_key_value_heads=kv, head_dim=hd, tie_word_embeddings=tied,
                                       vocab_size=151936, hidden_act="silu")
    for size, (h, i, n, q, kv, hd, tied) in _QWEN3.items() for suffix in ("", "-Base")
}


def parameters(c: dict) -> int:
    """Parameters of a decoder-only transformer with a gated MLP from its config (norms left out: < 0.01 %)."""
    h, n = c["hidden_size"], c["num_hidden_layers"]
    i = c.get("intermediate_size") or h
    heads = c.get("num_attention_heads") or 1
    kv = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    gated = c.get("hidden_act", "silu") in ("silu", "swish")
    attn = h * heads * hd * 2 + h * kv * hd * 2
    mlp = (3 if gated else 2) * h * i
    embed = c["vocab_size"] * h * (1 if c.get("tie_word_embeddings", False) else 2)
    return embed + n * (attn + mlp)


def shape_from_config(c: dict) -> Shape:
    return Shape.of(SimpleNamespace(**{k: c.get(k) for k in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size")}), parameters(c))


def model_shape(model: Optional[str], testbed=None) -> tuple[Optional[Shape], str]:
    """(shape, where it came from) of TrainConfig.model (None: the embedded testbed, `testbed` its config)."""
    if model is None:
        from ..tasks.testbed.model import model_config
        from ..tasks.testbed.tokenizer import build_tokenizer

        c = model_config(testbed, build_tokenizer()).to_dict()
        return shape_from_config(c), "the embedded testbed's config"
    if model in KNOWN:
        return shape_from_config(KNOWN[model]), f"{model}'s config.json values (preflight/shapes.py)"
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":  # the GGUF file's own metadata, as transformers reads it
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
        return shape_from_config(config), f"{path}'s GGUF metadata"
    found = path / "config.json" if (path / "config.json").is_file() else cached_config(model)
    if found is not None:
        try:
            return shape_from_config(json.loads(found.read_text())), str(found)
        except (KeyError, TypeError, ValueError) as e:  # not a decoder config this estimate knows
            return None, f"{found}: no decoder shape in it ({type(e).__name__}: {e})"
    return None, (f"{model}: no config.json there, none in the Hugging Face cache ({hub_cache()}), and not among the "
                  f"known hub names ({', '.join(sorted(KNOWN))})")


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it from the environment."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def cached_config(model: str) -> Optional[Path]:
    """A hub model's cached config.json (models--ORG--NAME/snapshots/REV/config.json; the newest revision), or
    None."""
    if model.count("/") != 1 or model.startswith((".", "/", "~")):
        return None
    snapshots = hub_cache() / ("models--" + model.replace("/", "--")) / "snapshots"
    found = [c for c in snapshots.glob("*/config.json") if c.is_file()]
    return max(found, key=lambda c: c.stat().st_mtime) if found else None
