"""Run by tests/trainer/test_logprobs.py in a fresh process: one forward + backward of `token_logps` on a causal LM
with a large vocabulary; prints the rise of the process's peak resident memory over it, and the bytes of the batch's
float32 completion logits (B x C x V x 4). argv: chunk_bytes (a huge value is the one-pass, full-logits path).

Run with MALLOC_MMAP_THRESHOLD_ fixed, so that glibc serves every large tensor from its own mapping and gives it
back when freed: the resident peak is then the live tensors' peak, not the heap's high-water mark. The peak is
this process image's (`VmHWM`), not `getrusage`'s `ru_maxrss`, which keeps the forking parent's high-water mark
across the exec: forked from a large pytest worker, the child's ru_maxrss starts above anything it allocates."""
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from grpo_replay.trainer.logprobs import token_logps

V, B, P, C = 32768, 4, 8, 512


def main() -> None:
    chunk = int(sys.argv[1])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
    pi, pm = torch.randint(0, V, (B, P)), torch.ones(B, P, dtype=torch.long)
    ci, cm = torch.randint(0, V, (B, C)), torch.ones(B, C)

    def step(rows: int) -> None:
        token_logps(model, pi[:rows], pm[:rows], ci[:rows], cm[:rows], 1.0, chunk_bytes=chunk).sum().backward()

    step(1)  # gradients allocated and kernels loaded before the measured pass
    before = peak_rss()
    step(B)
    print(peak_rss() - before, B * C * V * 4)


def peak_rss() -> int:
    """Bytes: the resident high-water mark of this process image (Linux `/proc/self/status` VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


if __name__ == "__main__":
    main()
