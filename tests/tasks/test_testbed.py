"""Tests of the embedded CPU testbed (task, tokenizer, tiny model, cached warm start)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerFast

from grpo_replay.tasks.testbed import (
    TestbedConfig, TestbedProblem, TestbedTask, build_model, build_tokenizer, extract_answer,
    generate_completions, make_problem, n_params, sampled_pass_rate, target_completion,
    uses_working, warm_start,
)
from grpo_replay.tasks.testbed.warmstart import sft_batch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models are overhead-bound; one intra-op thread is faster and immune to oversubscription."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def task() -> TestbedTask:
    return TestbedTask(TestbedConfig())


# ------------------------------------------------------------------ tokenizer
@pytest.mark.parametrize("text", ["37+485=", "37+485=[225]522<eos>", "9+9=18", "1+2+3=[6]6<eos>", ""])
def test_tokenizer_round_trip(text):
    tok = build_tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.replace("<eos>", "E"))  # one token per character
    assert tok.decode(ids) == text
    assert tok.unk_token_id not in ids


def test_tokenizer_special_tokens_and_left_padding():
    tok = build_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert len({tok.pad_token_id, tok.eos_token_id, tok.bos_token_id}) == 3
    assert tok.padding_side == "left"
    enc = tok(["1+2=", "37+485="], padding=True, return_tensors="pt")
    assert enc["input_ids"][0, 0].item() == tok.pad_token_id
    assert enc["attention_mask"][0].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert enc["input_ids"][1, 0].item() == tok.bos_token_id
    assert tok.decode(enc["input_ids"][0], skip_special_tokens=True) == "1+2="


def test_tokenizer_save_load_round_trip(tmp_path):
    tok = build_tokenizer()
    tok.save_pretrained(tmp_path)
    for cls in (PreTrainedTokenizerFast, AutoTokenizer):
        tok2 = cls.from_pretrained(tmp_path)
        text = "37+485=[225]522<eos>"
        assert tok2(text)["input_ids"] == tok(text)["input_ids"]
        assert tok2.decode(tok(text)["input_ids"]) == "<bos>" + text
        assert (tok2.pad_token_id, tok2.eos_token_id, tok2.bos_token_id) == (
            tok.pad_token_id, tok.eos_token_id, tok.bos_token_id)
        assert tok2.padding_side == "left"


# --------------------------------------------------------------------- reward
def test_reward_hand_written(task):
    p = make_problem([37, 485])
    assert p.prompt == "37+485=" and p.answer == "522" and p.difficulty == 3
    good = ["522", "522<eos>", "[225]522<eos>", "[999]522<eos>", " 522 <eos>", "522<eos>17",
            "522<eos><pad><pad>", "[225]522", "0522<eos>", "[2]]522<eos>"]
    bad = ["523<eos>", "[225]<eos>", "[225522<eos>", "[225]52<eos>", "", "<eos>", "52 2<eos>",
           "522+1<eos>", "=522<eos>", "abc", "[522]", "5[22]<eos>", "<eos>522", "-522"]
    for c in good:
        assert task.reward(c, p) == 1.0, c
    for c in bad:
        assert task.reward(c, p) == 0.0, c
    assert extract_answer("[225]522<eos>") == "522"
    assert extract_answer("[225") is None
    assert extract_answer("x") is None
    assert uses_working("[225]522<eos>") and not uses_working("522<eos>")
    assert not uses_working("522<eos>[1]")  # after EOS does not count
    assert task.uses_working("[225") and task.extract_answer("522") == "522"


def test_reward_require_eos():
    t = TestbedTask(TestbedConfig(require_eos=True))
    p = make_problem([1, 2])
    assert t.reward("3<eos>", p) == 1.0
    assert t.reward("3", p) == 0.0  # truncated


def test_targets_are_rewarded(task):
    rng = np.random.default_rng(0)
    for p in task.sample_problems(rng, 200):
        for w in (False, True):
            c = target_completion(p, w)
            assert task.reward(c + "<eos>", p) == 1.0
            assert task.uses_working(c) == w
            assert len(c) + 1 <= task.max_completion_chars()
        assert task.reward("[" + p.answer[::-1] + "]" + str(int(p.answer) + 1), p) == 0.0


# ------------------------------------------------------------------- problems
def test_problems_mixed_difficulty_and_heldout(task):
    rng = np.random.default_rng(1)
    ps = task.sample_problems(rng, 2000)
    assert all(isinstance(p, TestbedProblem) for p in ps)
    counts = {d: sum(p.difficulty == d for p in ps) for d in task.levels}
    assert set(counts) == {1, 2, 3, 4}
    for d, w in zip(task.levels, task.level_probs):
        assert abs(counts[d] / len(ps) - w) < 0.05
    for p in ps:
        ops = p.operands
        assert sum(ops) == int(p.answer) and p.prompt.endswith("=")
        assert [int(x) for x in p.prompt[:-1].split("+")] == ops
        assert all(len(x) == 4 for x in p.prompt[:-1].split("+"))  # zero-padded
        assert max(len(str(x)) for x in ops) == p.difficulty
        assert not task.is_heldout(p)
    held = task.heldout(300, seed=3)
    assert held == task.heldout(300, seed=3)
    assert held != task.heldout(300, seed=4)
    train_ids = {p.id for p in ps if p.difficulty >= 2}
    assert not train_ids & {p.id for p in held}
    assert all(task.is_heldout(p) for p in held if p.difficulty >= 2)
    assert len({p.difficulty for p in held}) == 4
    unpadded = TestbedTask(TestbedConfig(pad_operands=False)).sample_problems(np.random.default_rng(1), 50)
    assert all(p.prompt == p.id + "=" for p in unpadded)


def test_three_operand_items():
    t = TestbedTask(TestbedConfig(three_operand_prob=0.3))
    ps = t.sample_problems(np.random.default_rng(0), 500)
    three = [p for p in ps if p.difficulty == 5]
    assert 80 < len(three) < 220
    assert all(len(p.operands) == 3 and sum(p.operands) == int(p.answer) for p in three)
    assert all(t.reward(target_completion(p, True), p) == 1.0 for p in three)


def test_sft_batch_masks_prompt(task):
    rng = np.random.default_rng(0)
    ps = task.sample_problems(rng, 8)
    ids, mask, labels = sft_batch(task, ps, rng)
    tok = task.tokenizer
    for i, p in enumerate(ps):
        n = len(p.prompt) + 1
        assert ids[i, 0].item() == tok.bos_token_id
        assert (labels[i, :n] == -100).all()
        comp = labels[i, n:][labels[i, n:] != -100].tolist()
        assert comp[-1] == tok.eos_token_id
        assert task.reward(tok.decode(comp), p) == 1.0
        assert mask[i].sum().item() == n + len(comp)


# ---------------------------------------------------------------------- model
def test_build_model_and_generate():
    cfg = TestbedConfig.tiny()
    task = TestbedTask(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, task.tokenizer)
    assert isinstance(model, PreTrainedModel) and model.dtype == torch.float32
    assert model.config.model_type == "llama"
    assert n_params(model) < 100_000
    ps = task.sample_problems(np.random.default_rng(0), 3)
    texts, ids = generate_completions(model, task.tokenizer, [p.prompt for p in ps], 4, max_new_tokens=6, seed=0)
    assert len(texts) == 12 and ids.shape[0] == 12 and ids.shape[1] <= 6
    texts2, _ = generate_completions(model, task.tokenizer, [p.prompt for p in ps], 4, max_new_tokens=6, seed=0)
    assert texts == texts2
    r = sampled_pass_rate(model, task, ps, n_samples=2, max_new_tokens=6)
    assert 0.0 <= r <= 1.0
    q = build_model(TestbedConfig.tiny(model_type="qwen2"), task.tokenizer)
    assert q.config.model_type == "qwen2"


# ------------------------------------------------------------------ warm start
def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_warm_start_cache_and_determinism(tmp_path, monkeypatch):
    cfg = TestbedConfig.tiny(cache_dir=str(tmp_path / "a"))
    m1, tok1, info1 = warm_start(cfg, progress=False)
    path = cfg.cache_path()
    assert not info1["from_cache"] and info1["cache_path"] == str(path)
    assert (path / "model.safetensors").is_file() and (path / "info.json").is_file()
    saved = json.loads((path / "info.json").read_text())
    for k in ("pass_rate", "step", "seconds", "seed", "n_params", "pass_rate_by_difficulty"):
        assert k in saved
    assert 0 < saved["step"] <= cfg.warmstart_max_steps

    # second call: loaded, no retraining, identical weights
    import grpo_replay.tasks.testbed.warmstart as ws
    monkeypatch.setattr(ws, "train_warm_start", lambda *a, **k: pytest.fail("retrained"))
    m2, tok2, info2 = warm_start(cfg, progress=False)
    assert info2["from_cache"] and info2["step"] == info1["step"]
    w1, w2 = _weights(m1), _weights(m2)
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    assert tok2("12+3=")["input_ids"] == tok1("12+3=")["input_ids"]
    monkeypatch.undo()

    # same seed, different cache root -> same weights; different seed -> different weights
    cfg_b = TestbedConfig.tiny(cache_dir=str(tmp_path / "b"))
    assert cfg_b.cache_key() == cfg.cache_key()
    m3, _, info3 = warm_start(cfg_b, progress=False)
    assert not info3["from_cache"]
    w3 = _weights(m3)
    assert all(torch.equal(w1[k], w3[k]) for k in w1)
    assert info3["pass_rate"] == info1["pass_rate"] and info3["step"] == info1["step"]
    cfg_c = TestbedConfig.tiny(cache_dir=str(tmp_path / "a"), seed=1)
    assert cfg_c.cache_path() != path
    m4, _, _ = warm_start(cfg_c, progress=False)
    assert not all(torch.equal(w1[k], v) for k, v in _weights(m4).items())


@pytest.mark.parametrize("damage", ["truncated weights", "one weight byte flipped", "info.json not JSON",
                                    "tokenizer.json removed"])
def test_a_damaged_warm_start_cache_is_recomputed_not_a_crash(tmp_path, damage):
    """A cache hit that cannot be read, or whose weights are not the ones it recorded, is recomputed (a warning says
    so): the warm start is deterministic, so the result is the same model."""
    cfg = TestbedConfig.tiny(cache_dir=str(tmp_path))
    m1, _, info1 = warm_start(cfg, progress=False)
    path = cfg.cache_path()
    weights = path / "model.safetensors"
    if damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "one weight byte flipped":  # still a valid file: only the recorded checksum can tell
        b = bytearray(weights.read_bytes())
        b[-3] ^= 0x01
        weights.write_bytes(bytes(b))
    elif damage == "info.json not JSON":
        (path / "info.json").write_text("{not json")
    else:
        (path / "tokenizer.json").unlink()
    with pytest.warns(UserWarning, match="cached testbed warm start is unreadable"):
        m2, _, info2 = warm_start(cfg, progress=False)
    assert not info2["from_cache"] and info2["step"] == info1["step"]
    w1, w2 = _weights(m1), _weights(m2)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    _, _, info3 = warm_start(cfg, progress=False)  # and the cache is whole again
    assert info3["from_cache"] and json.loads((path / "info.json").read_text())["weights_sha256"]


def test_cache_dir_default(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_REPLAY_CACHE", str(tmp_path))
    cfg = TestbedConfig()
    assert cfg.cache_path() == tmp_path / "testbed" / cfg.cache_key()
    monkeypatch.delenv("GRPO_REPLAY_CACHE")
    assert "grpo-replay/testbed" in str(TestbedConfig().cache_path())
    assert TestbedConfig(cache_dir="/x").cache_key() == cfg.cache_key()
    assert TestbedConfig(seed=3).cache_key() != cfg.cache_key()


def test_policy_stats_smoke():
    from grpo_replay.tasks.testbed import forced_mode_pass_rate, policy_stats
    cfg = TestbedConfig.tiny()
    task = TestbedTask(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, task.tokenizer)
    ps = task.heldout(6, seed=0)
    st = policy_stats(model, task, ps, group_size=4, max_new_tokens=6, prompts_per_call=4)
    assert st["n_problems"] == 6 and 0.0 <= st["pass_rate"] <= 1.0
    assert abs(st["frac_groups_all_wrong"] + st["frac_groups_all_correct"] + st["frac_groups_mixed"] - 1) < 1e-9
    fw = forced_mode_pass_rate(model, task, ps, working=True, n_samples=2, max_new_tokens=6)
    assert set(fw) <= {1, 2}


def test_warm_start_cut_by_the_wall_clock_cap_is_used_but_not_cached(tmp_path):
    # A cap-stopped warm start depends on the machine's load; caching it made later runs start from it.
    cfg = TestbedConfig.tiny(cache_dir=str(tmp_path), warmstart_max_seconds=1e-9, warmstart_max_steps=40)
    with pytest.warns(UserWarning, match="not cached"):
        model, _, info = warm_start(cfg, progress=False)
    assert info["stop_reason"] == "max_seconds" and info["steps_run"] == cfg.warmstart_eval_every
    assert not info["from_cache"] and info["cache_path"] is None
    assert not any(tmp_path.iterdir()), "a cap-stopped warm start must not be cached"
    # the cap is not part of the cache key, and by default there is none
    assert TestbedConfig().warmstart_max_seconds is None
    assert TestbedConfig.tiny(warmstart_max_seconds=5.0).cache_key() == TestbedConfig.tiny().cache_key()
    with pytest.raises(ValueError, match="warmstart_max_seconds"):
        TestbedConfig.tiny(warmstart_max_seconds=0)


# ---------------------------------------------------------- reasoning variant
def test_default_cache_keys_unchanged_by_the_reasoning_fields():
    # The reasoning variant's fields (task, operands_min, operands_max) are hashed only when set: every config
    # that existed before them keeps its cache key, so cached warm starts stay valid.
    assert TestbedConfig().cache_key() == "a349de0bf05af1ef"
    assert TestbedConfig.tiny().cache_key() == "1c92841bc2f51d66"
    assert TestbedConfig(operands_max=8).cache_key() == TestbedConfig().cache_key()
    keys = {TestbedConfig.reasoning().cache_key(), TestbedConfig.reasoning(operands_max=7,
            difficulty_weights=(1.0,) * 5).cache_key(), TestbedConfig().cache_key()}
    assert len(keys) == 3
    assert TestbedConfig.named("default") == TestbedConfig()
    assert TestbedConfig.named("reasoning") == TestbedConfig.reasoning()
    assert TestbedConfig.named("reasoning", hidden_size=32).hidden_size == 32
    with pytest.raises(ValueError, match="unknown testbed preset"):
        TestbedConfig.named("nope")
    with pytest.raises(ValueError, match="task"):
        TestbedConfig(task="nope")
    with pytest.raises(ValueError, match="operands_min..operands_max"):
        TestbedConfig.reasoning(difficulty_weights=(1.0, 1.0))
    with pytest.raises(ValueError, match="three_operand_prob"):
        TestbedConfig.reasoning(three_operand_prob=0.2)


@pytest.fixture(scope="module")
def rtask() -> TestbedTask:
    return TestbedTask(TestbedConfig.reasoning())


def test_reasoning_reward_hand_written(rtask):
    p = make_problem([3, 5, 8, 9], difficulty=4)
    assert p.prompt == "3+5+8+9=" and p.answer == "25"
    assert rtask.target_completion(p, True) == "[09=17=22=25]25"
    assert rtask.target_completion(p, False) == "25"
    good = ["[09=17=22=25]25<eos>", "25<eos>", "[09=17=22=25]25", "[99=98]25<eos>",  # working is not verified
            "[09=17=22=25]]25<eos>", "[09=17=22=25]25<eos>[9]7"]
    bad = ["[09=17=22=25]<eos>",  # no answer after the working
           "[09=17=22=2525<eos>",  # unclosed working
           "[09=17=22=25]26<eos>", "[09=17=22=25]25=25<eos>", "[09=17=22=25]2 5<eos>", "[09=17=22=25<eos>]25",
           "25]03[<eos>", "<eos>[09=17=22=25]25", ""]
    for c in good:
        assert rtask.reward(c, p) == 1.0, c
    for c in bad:
        assert rtask.reward(c, p) == 0.0, c
    assert rtask.uses_working("[09=17") and not rtask.uses_working("25<eos>")


def test_reasoning_problems_and_targets(rtask):
    cfg = rtask.cfg
    assert rtask.levels == list(range(3, 9))
    ps = rtask.sample_problems(np.random.default_rng(0), 1200)
    counts = {d: sum(p.difficulty == d for p in ps) for d in rtask.levels}
    assert all(abs(c / len(ps) - 1 / 6) < 0.05 for c in counts.values())
    for p in ps:
        assert len(p.operands) == p.difficulty and all(0 <= x <= 9 for x in p.operands)
        assert p.prompt == p.id + "=" and sum(p.operands) == int(p.answer)
        assert not rtask.is_heldout(p)
        w, bare = rtask.target_completion(p, True), rtask.target_completion(p, False)
        assert rtask.reward(w + "<eos>", p) == 1.0 and rtask.reward(bare + "<eos>", p) == 1.0
        assert 10 <= len(w) + 1 <= rtask.max_completion_chars() <= cfg.max_new_tokens  # tokens incl. EOS
        assert len(bare) + 1 <= 3
        sums = w[1:w.index("]")].split("=")
        assert len(sums) == p.difficulty and all(len(s) == 2 for s in sums) and int(sums[-1]) == int(p.answer)
    held = rtask.heldout(200, seed=1)
    assert all(rtask.is_heldout(p) for p in held)
    assert not {p.id for p in held} & {p.id for p in ps}
    # the supervised mix writes the working with working_prob of the level
    rng = np.random.default_rng(2)
    work = np.mean([rtask.uses_working(rtask.sft_example(p, rng)) for p in ps])
    assert abs(work - np.mean(cfg.working_prob)) < 0.06
    # two-digit operands are possible too (digits_max), with wider partial sums
    t2 = TestbedTask(TestbedConfig.reasoning(digits_max=2, operands_max=4, difficulty_weights=(1.0, 1.0)))
    p2 = make_problem([37, 5, 19], difficulty=3, width=2)
    assert p2.prompt == "37+05+19=" and t2.target_completion(p2, True) == "[019=024=061]61"
    assert t2.reward("[019=024=061]61<eos>", p2) == 1.0


def test_reasoning_sft_batch_and_forced_modes(rtask):
    rng = np.random.default_rng(0)
    ps = rtask.sample_problems(rng, 8)
    ids, mask, labels = sft_batch(rtask, ps, rng)
    assert ids.shape[1] <= TestbedConfig.reasoning().max_position_embeddings
    from grpo_replay.tasks.testbed import forced_mode_pass_rate
    cfg = TestbedConfig.reasoning(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    model = build_model(cfg, rtask.tokenizer)
    for working in (True, False):
        r = forced_mode_pass_rate(model, rtask, ps, working=working, n_samples=2)
        assert set(r) <= set(rtask.levels) and all(0.0 <= v <= 1.0 for v in r.values())
