"""CPU twins of the TRL examples: examples/trl/train_qwen3_math_replay.py with its YAML, and the async example with
its YAML, run through their own `main()` (TrlParser, preflight, dataset and model loading, the examples' math
reward, the trainer's real `train()`), at toy shapes given as the command-line overrides a user would type. Only
what needs a GPU is replaced: the colocated vLLM (`--use_vllm false`, TRL then generates with transformers) and the
async example's vLLM server (an in-process rollout worker and a weight copy). Each checks the realised replay share
(scripts/check_replay_share.py on the run's own trainer_state.json), the seeds, and a fresh output folder."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytest.importorskip("trl")
pytest.importorskip("math_verify")

from tiny_math_model import EXAMPLES, ROOT, make_tokenizer, save_dataset, save_model  # noqa: E402

CHECK = ROOT / "scripts/check_replay_share.py"
# The examples' batch mapping kept (steps_per_generation = gradient_accumulation_steps, the YAML's), scaled down.
TOY = ["--use_cpu", "true", "--bf16", "false", "--gradient_checkpointing", "false", "--per_device_train_batch_size",
       "4", "--num_generations", "4", "--max_completion_length", "6", "--max_steps", "3", "--replay_warmup_steps", "1",
       "--report_to", "none", "--save_strategy", "no", "--learning_rate", "1e-2", "--disable_tqdm", "true"]


def _script(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # the async example imports the synchronous one
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)
    spec.loader.exec_module(mod)
    return mod


def _share_ok(out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), str(out), "--ratio", "0.5"], capture_output=True, text=True)


def test_tokenizer_holds_the_boxed_answers_whole():
    tok = make_tokenizer()
    ids = tok("x \\boxed{2}")["input_ids"]
    assert tok.convert_ids_to_tokens(ids)[-1] == "\\boxed{2}" and tok.decode(ids[-1:]) == "\\boxed{2}"


def test_sync_example_twin(tmp_path, monkeypatch):
    script = _script("train_qwen3_math_replay", monkeypatch)
    model, data = save_model(tmp_path / "model"), save_dataset(tmp_path / "data")
    seen = {}
    real = script.ReplayGRPOTrainer

    def keep(*a, **kw):
        seen["trainer"] = t = real(*a, **kw)
        return t

    monkeypatch.setattr(script, "ReplayGRPOTrainer", keep)
    runs = {}
    for arm in ("paper", "grpo"):  # the two documented launches: the paper arm, then its GRPO baseline
        out = tmp_path / f"out-{arm}"
        assert not out.exists()
        monkeypatch.setattr(sys, "argv", [
            "train_qwen3_math_replay.py", "--config", str(EXAMPLES / "qwen3_0.6b_math_replay.yaml"),
            "--model_name_or_path", str(model), "--dataset_name", str(data), "--output_dir", str(out),
            "--replay_preset", arm, "--use_vllm", "false", "--vllm_importance_sampling_correction", "false",
            "--gradient_accumulation_steps", "2", "--steps_per_generation", "2", *TOY])
        script.main()
        runs[arm] = seen["trainer"]
        assert (out / "trainer_state.json").is_file() and (out / "model.safetensors").is_file()
    paper, grpo = runs["paper"], runs["grpo"]
    assert paper.args.steps_per_generation == paper.args.gradient_accumulation_steps == 2
    ok = _share_ok(tmp_path / "out-paper")
    assert ok.returncode == 0, ok.stderr  # some step replayed exactly ratio/(1+ratio) of its rows
    assert "0.333" in ok.stdout
    assert _share_ok(tmp_path / "out-grpo").returncode == 1  # the baseline replays nothing: the check sees it
    # Arms of one seed are paired: the same seed, the replay draw seeded from it.
    assert paper.args.seed == grpo.args.seed == 0 and paper.replay_config is not None


@pytest.mark.slow
def test_async_example_twin(tmp_path, monkeypatch):
    from grpo_replay.integrations.trl.async_local import CopyWeightTransfer, InProcessRolloutWorker, \
        enable_cpu_async_grpo

    script = _script("train_qwen3_math_async_replay", monkeypatch)
    enable_cpu_async_grpo()
    model, data = save_model(tmp_path / "model"), save_dataset(tmp_path / "data")
    seen = {}
    real = script.ReplayAsyncGRPOTrainer

    def with_local_worker(*, model, reward_funcs, args, train_dataset):
        # The vLLM server's stand-in: a worker generating with a copy of the policy, kept equal by a weight copy.
        from transformers import AutoModelForCausalLM

        copy = AutoModelForCausalLM.from_pretrained(model)
        worker = InProcessRolloutWorker(copy, make_tokenizer(), train_dataset, reward_funcs,
                                        num_generations=args.num_generations,
                                        max_completion_length=args.max_completion_length, seed=args.seed)
        seen["trainer"] = t = real(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                                   processing_class=make_tokenizer(), rollout_worker=worker,
                                   weight_transfer=CopyWeightTransfer(copy))
        return t

    monkeypatch.setattr(script, "ReplayAsyncGRPOTrainer", with_local_worker)
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", [
        "train_qwen3_math_async_replay.py", "--config", str(EXAMPLES / "qwen3_0.6b_math_async_replay.yaml"),
        "--model_name_or_path", str(model), "--dataset_name", str(data), "--output_dir", str(out),
        "--gradient_accumulation_steps", "2", "--token_budget", "0", *TOY,
        "--per_device_train_batch_size", "6"])  # 12 samples a step: 8 fresh + 4 replayed, the ratio's third
    script.main()
    t = seen["trainer"]
    assert t.args.dtype == "float32" and t.args.learning_rate == 1e-2  # the YAML's dtype, the toy's rate
    replayed = [r for r in t.replay_history if r["replay_rows"]]
    assert replayed and all(r["replay_rows"] * 3 == r["fresh_rows"] + r["replay_rows"] for r in replayed), list(t.replay_history)
    ok = _share_ok(out)
    assert ok.returncode == 0, ok.stderr
    assert t.replay_composer is not None and t.args.seed == 0
