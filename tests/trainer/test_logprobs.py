"""token_logps: the chunked path (decoder, then head + log-softmax over completion positions in chunks) equals the
one-pass full-logits path, values and gradients, and its peak memory stays far below the full logits'."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from grpo_replay.trainer.logprobs import split_head, token_logps

FULL = 1 << 60  # chunk_bytes so large that every batch takes the one-pass path


def _model(vocab=1000, **extra):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, **extra)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")


def _batch(vocab=1000, B=4, P=6, C=9):
    g = torch.Generator().manual_seed(1)
    pi, pm = torch.randint(0, vocab, (B, P), generator=g), torch.ones(B, P, dtype=torch.long)
    pm[0, :3] = 0  # left padding
    ci, cm = torch.randint(0, vocab, (B, C), generator=g), torch.ones(B, C)
    cm[1, 5:] = 0  # a short completion
    cm[2] = 0  # an empty one
    return pi, pm, ci, cm


@pytest.mark.parametrize("chunk_bytes", [1, 4000 * 5, 4000 * 1000])  # 1 token, 5 tokens, all tokens per chunk
def test_chunked_equals_full_logits_values_and_gradients(chunk_bytes):
    model, batch = _model(), _batch()
    full = token_logps(model, *batch, temperature=0.7, chunk_bytes=FULL)
    full.sum().backward()
    g_full = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    chunked = token_logps(model, *batch, temperature=0.7, chunk_bytes=chunk_bytes)
    chunked.sum().backward()
    assert chunked.shape == full.shape == (4, 9) and chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)
    assert (chunked[2] == 0).all() and (chunked[1, 5:] == 0).all() and (chunked[0] < 0).all()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, g_full[n], rtol=1e-4, atol=1e-6, msg=n)


def test_chunked_equals_full_without_grad():
    model, batch = _model(), _batch()
    with torch.no_grad():
        torch.testing.assert_close(token_logps(model, *batch, chunk_bytes=40),
                                   token_logps(model, *batch, chunk_bytes=FULL), rtol=1e-5, atol=1e-5)


def test_heads_that_are_not_a_plain_linear_map_keep_the_models_forward():
    assert split_head(_model()) is not None
    model = _model()
    model.config.logit_scale = 0.5  # Cohere-style scaled logits: the decoder + head split would drop the scale
    assert split_head(model) is None
    batch = _batch()
    torch.testing.assert_close(token_logps(model, *batch, chunk_bytes=1), token_logps(model, *batch, chunk_bytes=FULL))


def _peak(chunk_bytes: int) -> tuple[int, int]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("logprobs_peak.py")), str(chunk_bytes)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rise, logits = map(int, out.stdout.split())
    return rise, logits


@pytest.mark.slow
def test_peak_memory_is_far_below_the_full_logits():
    """V = 32,768, 4 rows x 512 completion tokens: the completion logits alone are 256 MiB in float32. The one-pass
    path's peak rises by at least that (the measurement sees logits); the chunked path's (8 MiB chunks) by under an
    eighth of it."""
    full_rise, logits = _peak(FULL)
    chunked_rise, _ = _peak(8 << 20)
    assert full_rise >= logits, (full_rise, logits)
    assert chunked_rise < logits / 8, (chunked_rise, logits)
