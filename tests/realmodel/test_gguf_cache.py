"""`models.dense_source`: the dequantized-GGUF cache's keying, reuse, tamper checks and race handling.

transformers' dequantization is replaced by a tiny model saved from a config (it takes ~50 s on SmolLM2; the
real path, with the same weights as a direct GGUF load, is checked in test_smollm2.py); everything around it
(keys, manifest, rename into place, rebuild) is the real code."""
from __future__ import annotations

import json
import warnings

import pytest
from transformers import AutoModelForCausalLM

from grpo_replay.app import models
from grpo_replay.app.models import CACHE_MANIFEST, ModelSource, dense_source


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A '.gguf' file, a cache root of its own and a counting stand-in for the dequantizer."""
    monkeypatch.setenv("GRPO_REPLAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GRPO_REPLAY_GGUF_CACHE", raising=False)
    f = tmp_path / "m" / "tiny.gguf"
    f.parent.mkdir()
    f.write_bytes(b"GGUF" + bytes(range(256)))
    calls = []

    def dequantize_into(source, out):
        from transformers import LlamaConfig, LlamaForCausalLM

        calls.append(source)
        cfg = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
        LlamaForCausalLM(cfg).save_pretrained(out)

    monkeypatch.setattr(models, "_dequantize_into", dequantize_into)
    return ModelSource(str(f.parent), f.name), calls


def test_made_once_then_reused(fake_gguf):
    source, calls = fake_gguf
    a = dense_source(source)
    b = dense_source(source)
    assert a == b and a.gguf_file is None and len(calls) == 1
    manifest = json.loads((models.Path(a.path) / CACHE_MANIFEST).read_text())
    assert manifest["gguf_file"].endswith("tiny.gguf") and list(manifest["weights_sha256"]) == ["model.safetensors"]
    assert AutoModelForCausalLM.from_pretrained(a.path).config.vocab_size == 32
    assert not [p for p in models.Path(a.path).parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_other_content_other_entry(fake_gguf):
    source, calls = fake_gguf
    a = dense_source(source)
    models.Path(source.path, source.gguf_file).write_bytes(b"GGUF" + bytes(300))  # replaced by another model
    b = dense_source(source)
    assert a.path != b.path and len(calls) == 2


@pytest.mark.parametrize("damage", ["flip_weight_byte", "truncate_weights", "drop_weights", "drop_manifest", "garble_manifest"])
def test_a_tampered_entry_is_rebuilt_with_a_warning(fake_gguf, damage):
    source, calls = fake_gguf
    entry = models.Path(dense_source(source).path)
    weights, manifest = entry / "model.safetensors", entry / CACHE_MANIFEST
    if damage == "flip_weight_byte":
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF  # inside the tensor data: safetensors itself would load it without complaint
        weights.write_bytes(bytes(data))
    elif damage == "truncate_weights":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "drop_weights":
        weights.unlink()
    elif damage == "drop_manifest":
        manifest.unlink()
    else:
        manifest.write_text("{not json")
    with pytest.warns(UserWarning, match="unusable .* rebuilding"):
        again = dense_source(source)
    assert again.path == str(entry) and len(calls) == 2 and models._check_entry(entry) is None


def test_losing_the_race_uses_the_winners_entry(fake_gguf, monkeypatch):
    """Two runs start at once: the other one renames its entry into place while we dequantize."""
    source, calls = fake_gguf
    real = models._dequantize_into

    def racing(src, out):
        real(src, out)
        if len(calls) == 1:  # we are mid-build; the other process finishes first
            dense_source(src)

    monkeypatch.setattr(models, "_dequantize_into", racing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = dense_source(source)
    assert len(calls) == 2 and models._check_entry(models.Path(got.path)) is None
    assert [p.name for p in models.Path(got.path).parent.iterdir()] == [models.Path(got.path).name]


@pytest.mark.parametrize("off", ["0", "off", "false", "No"])
def test_switched_off(fake_gguf, monkeypatch, off):
    source, calls = fake_gguf
    monkeypatch.setenv("GRPO_REPLAY_GGUF_CACHE", off)
    assert dense_source(source) == source and not calls


def test_a_non_gguf_source_is_untouched(fake_gguf):
    _, calls = fake_gguf
    s = ModelSource("/some/dir")
    assert dense_source(s) is s and not calls
