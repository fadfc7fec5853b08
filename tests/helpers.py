"""Synthetic rollout batches for core tests, and the tiny trainer settings (`TINY`) for the app-layer tests.

Importing this module imports only the core: `TINY` is built on first use, so a core test never loads the
trainer stack."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from grpo_replay import ReplayBuffer, ReplayConfig, RolloutBatch, group_advantages


def make_batch(
    n_groups: int = 4,
    group_size: int = 4,
    step: int = 0,
    seed: int = 0,
    rewards: torch.Tensor | None = None,
    max_prompt: int = 5,
    max_completion: int = 7,
    with_ref: bool = False,
) -> RolloutBatch:
    """A fresh padded batch with varied prompt/completion lengths and binary rewards."""
    g = torch.Generator().manual_seed(seed)
    B = n_groups * group_size
    group_ids = torch.arange(B) // group_size
    if rewards is None:
        rewards = torch.randint(0, 2, (B,), generator=g).float()
    adv, std = group_advantages(rewards, group_ids)
    plen = torch.randint(1, max_prompt + 1, (B,), generator=g)
    clen = torch.randint(1, max_completion + 1, (B,), generator=g)
    P, C = int(plen.max()), int(clen.max())
    pos_p = torch.arange(P).unsqueeze(0)
    prompt_mask = (pos_p >= P - plen.unsqueeze(1)).long()
    comp_mask = (torch.arange(C).unsqueeze(0) < clen.unsqueeze(1)).long()
    prompt_ids = torch.randint(1, 50, (B, P), generator=g) * prompt_mask
    comp_ids = torch.randint(1, 50, (B, C), generator=g) * comp_mask
    logps = -torch.rand(B, C, generator=g) * comp_mask
    return RolloutBatch.fresh(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=comp_ids,
        completion_mask=comp_mask,
        behaviour_logps=logps,
        advantages=adv,
        rewards=rewards,
        group_ids=group_ids,
        group_std=std,
        step=step,
        ref_logps=(-torch.rand(B, C, generator=g) * comp_mask) if with_ref else None,
    )


# Tiny sizes: a 1-layer width-32 model, 1-digit sums, 8 prompts x 4 rollouts, an 80-step warm start
# (about 12 % sampled pass rate, so groups with reward variance occur).
def __getattr__(name: str):
    # PEP 562: `from helpers import TINY` builds it here, importing the testbed's config only then.
    if name == "TINY":
        from grpo_replay.tasks.testbed.testbed_config import TINY_TESTBED

        return {
            "steps": 6,
            "prompts_per_step": 8,
            "group_size": 4,
            "eval_every": 3,
            "eval_problems": 16,
            "eval_samples": 2,
            "checkpoint_every": 2,
            "lr": 3e-3,
            "progress": False,
            "replay.warmup_steps": 2,
            **TINY_TESTBED,
        }
    raise AttributeError(name)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def refused(argv, out, capsys, *needles):
    """Run `grpo-replay ARGV` and check it is refused as bad input: exit 2 (from argparse or from the command), every
    needle in stderr, no traceback, and nothing at `out` (nothing computed or written). Returns stderr."""
    import pytest

    from grpo_replay.cli import main

    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err
    for n in needles:
        assert n in err, err
    assert "Traceback" not in err
    assert not out.exists()
    return err


def train_metrics(overrides: dict, out: Path, **extra) -> list[dict]:
    """`grpo-replay train` into `out`, every key of `overrides` and `extra` given as `--set` (progress off); returns the
    run's metrics rows."""
    from grpo_replay.cli import main

    argv = ["train", "--out", str(out), "--no-progress"]
    for k, v in {**overrides, **extra}.items():
        if k != "progress":
            argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    assert main(argv) == 0
    return read_jsonl(out / "metrics.jsonl")


class ToyLM(torch.nn.Module):
    """logits = an embedding of the input token (vocabulary 64): enough of a causal LM for token_logps."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(64, 64)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        import types

        return types.SimpleNamespace(logits=self.emb(input_ids))


def without_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


# The shared data sets lie beside the checkout (../shared/data), on a developer's machine and in CI alike.
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


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


def buffer_with_advantages(adv, priority="abs_advantage", alpha=0.5, replacement=False, seed=0):
    """A buffer of one-row groups with these advantages (and group_std = |advantage|), inserted at step 0."""
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, priority=priority, alpha=alpha, replacement=replacement), seed=seed)
    b = make_batch(n_groups=len(adv), group_size=1, seed=0)
    b.advantages = torch.tensor(adv, dtype=torch.float32)
    b.group_std = torch.tensor([abs(a) for a in adv], dtype=torch.float32)
    buf.add(b, 0)
    return buf


def estimator_loop(name, r, gid, eps):
    """(B,) float64: advantage estimator `name` (grpo_replay.ESTIMATORS) as a per-row loop over python floats,
    written from each estimator's definition (the reference the vectorised ones are tested against)."""
    rows, ids = [float(x) for x in r], [int(g) for g in gid]
    groups = {g: [rows[i] for i in range(len(rows)) if ids[i] == g] for g in set(ids)}

    def mean(xs):
        return sum(xs) / len(xs)

    def std(xs):
        return (sum((x - mean(xs)) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0

    dev = [rows[i] - mean(groups[ids[i]]) for i in range(len(rows))]
    out = []
    for i, x in enumerate(rows):
        g = groups[ids[i]]
        if name == "grpo":
            out.append(0.0 if dev[i] == 0 else dev[i] / (std(g) + eps))
        elif name == "dr_grpo":
            out.append(dev[i])
        elif name == "grpo_batch":
            out.append(0.0 if dev[i] == 0 else dev[i] / (std(rows) + eps))
        elif name == "rloo":
            others = list(g)
            others.remove(x)
            out.append(x - mean(others) if others else 0.0)
        else:  # reinforce_plus_plus_baseline
            c = dev[i] - mean(dev)
            out.append(0.0 if c == 0 else c / (std(dev) + eps))
    return torch.tensor(out, dtype=torch.float64)


def stored_rows(buffer: ReplayBuffer) -> list[tuple[int, float]]:
    """(birth step, advantage) of every stored row, sorted: what the buffer holds, whichever trainer filled it."""
    s = buffer.storage
    slots = s.valid_slots()
    return sorted(zip(s.col("birth_step")[slots].tolist(), [round(a, 5) for a in s.col("advantage")[slots].tolist()]))


def undeclared_metric_keys(keys) -> set[str]:
    """The replay metric keys of `keys` (under replay/, fresh/, buffer/, or the zero-variance share) that are neither
    a `metric_names` constant nor declared backend-only (`metric_names.BACKEND_ONLY`, each with its reason)."""
    from grpo_replay import metric_names as mn

    return mn.undeclared(keys)


LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def fresh_process_env(drop: tuple[str, ...] = (), drop_prefixes: tuple[str, ...] = ()) -> dict:
    """This process's environment without the distributed launch variables (and `drop`, and names starting with
    `drop_prefixes`): an in-process TRL or accelerate test may have left RANK / WORLD_SIZE / MASTER_PORT set (and a
    store listening on that port), and a child process, like a command typed in a fresh shell, must not join that
    group or bind that port."""
    gone = set(LAUNCH_VARS) | set(drop)
    prefixes = ("ACCELERATE_", *drop_prefixes)
    return {k: v for k, v in os.environ.items() if k not in gone and not k.startswith(prefixes)}


def restore_after(monkeypatch, *names: str) -> None:
    """Leave `names` unset for the test and put back their values (or their absence) after it, whatever the code
    under test writes into os.environ meanwhile (vLLM's colocated engine sets the launch variables itself)."""
    for k in names:
        monkeypatch.setenv(k, os.environ.get(k, ""))  # records the value, or the absence, to restore
        monkeypatch.delenv(k)
