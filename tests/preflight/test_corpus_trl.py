"""A corpus of TRL launches for `grpo-replay preflight`: plausible bad ones drawn from the checks of TRL 1.16
(GRPOConfig.__post_init__, GRPOTrainer's constructor), transformers' TrainingArguments, accelerate's launcher and
the replay trainers, each refused with exit 2 naming the setting as the user typed it, and then accepted once the
fix its refusal names is applied; and valid launches, each accepted. Host facts are faked (`Host`); no training."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("trl")

from grpo_replay.cli import main  # noqa: E402
from grpo_replay.preflight.host import Host  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SYNC = str(ROOT / "examples/trl/train_qwen3_math_replay.py")
ASYNC = str(ROOT / "examples/trl/train_qwen3_math_async_replay.py")
SYNC_YAML = str(ROOT / "examples/trl/qwen3_0.6b_math_replay.yaml")
ASYNC_YAML = str(ROOT / "examples/trl/qwen3_0.6b_math_async_replay.yaml")
MULTI_GPU = str(ROOT / "examples/trl/accelerate_multi_gpu.yaml")
CPU = Host(gpus=0, gpu_memory=0, driver=None, torch="2.13.0+cpu", torch_cuda=None, vllm=None)
H100S = Host(gpus=8, gpu_memory=81559 * 2**20, driver="580.65.06", torch="2.13.0+cpu", torch_cuda=None, vllm=None)
OLD_DRIVER = Host(gpus=8, gpu_memory=81559 * 2**20, driver="570.86.15", torch="2.13.0+cu130", torch_cuda="13.0",
                  vllm="0.31.0")


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No accelerate default config unless a case writes one; host facts from `host` (CPU unless a case says)."""
    import accelerate.commands.config.config_args as config_args
    import accelerate.commands.launch as launch

    default = tmp_path / "accelerate_default.yaml"
    monkeypatch.setattr(launch, "default_config_file", str(default))
    monkeypatch.setattr(config_args, "default_config_file", str(default))
    monkeypatch.chdir(tmp_path)
    return default


def preflight(launch: list[str], monkeypatch, host: Host = CPU) -> tuple[int, str]:
    monkeypatch.setattr(Host, "detect", classmethod(lambda cls: host))
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["preflight", *launch])
    return code, out.getvalue()


def acc8(*script_args: str, script: str = SYNC, config: str = SYNC_YAML) -> list[str]:
    return ["accelerate", "launch", "--config_file", MULTI_GPU, "--num_processes", "8", script, "--config", config,
            "--output_dir", "out", *script_args]


def python1(*script_args: str) -> list[str]:
    return ["python", SYNC, "--config", SYNC_YAML, "--output_dir", "out", *script_args]


def yaml_with(tmp: Path, base: str = SYNC_YAML, drop=(), **values) -> str:
    cfg = yaml.safe_load(Path(base).read_text())
    for key in drop:
        cfg.pop(key, None)
    cfg.update(values)
    path = tmp / f"cfg{len(list(tmp.glob('cfg*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


# (id, bad launch, host, the field as typed, text of the fix, the launch with that fix applied, its host)
def bad_cases(tmp: Path):
    bf16 = '{"dtype": "bfloat16"}'
    return [
        ("groups-8-processes", acc8("--num_generations", "24"), CPU, "--num_generations", "num_generations dividing "
         "512 (8, 16, 32)", acc8("--num_generations", "16"), CPU),
        ("one-generation", acc8("--num_generations", "1"), CPU, "--num_generations", "num_generations >= 2",
         acc8("--num_generations", "2"), CPU),
        ("groups-one-process", python1("--per_device_train_batch_size", "2", "--steps_per_generation", "1",
                                       "--gradient_accumulation_steps", "1"), CPU, "--per_device_train_batch_size",
         "multiple of 8", python1("--per_device_train_batch_size", "8", "--steps_per_generation", "1",
                                  "--gradient_accumulation_steps", "1"), CPU),
        ("both-batch-sizes", acc8("--generation_batch_size", "512"), CPU, "--generation_batch_size",
         "only one of generation_batch_size and steps_per_generation", acc8(), CPU),
        ("generation-batch-not-global-multiple",
         acc8(config=yaml_with(tmp, drop=("steps_per_generation",), generation_batch_size=100)), CPU,
         "generation_batch_size", "generation_batch_size a multiple of 128", acc8(config=yaml_with(
             tmp, drop=("steps_per_generation",), generation_batch_size=512)), CPU),
        ("auto-find-batch-size", acc8("--auto_find_batch_size", "true"), CPU, "--auto_find_batch_size",
         "Set auto_find_batch_size=False", acc8("--auto_find_batch_size", "false"), CPU),
        ("hub-repo-without-completions", acc8("--log_completions_hub_repo", "me/completions"), CPU,
         "--log_completions_hub_repo", "Enable log_completions", acc8("--log_completions_hub_repo", "me/completions",
                                                                      "--log_completions", "true"), CPU),
        ("is-clip-order", acc8("--vllm_importance_sampling_clip_min", "3", "--vllm_importance_sampling_clip_max", "2"),
         CPU, "--vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_min below "
         "vllm_importance_sampling_clip_max (2.0)", acc8("--vllm_importance_sampling_clip_min", "0.5",
                                                         "--vllm_importance_sampling_clip_max", "2"), CPU),
        ("eval-groups", acc8("--eval_strategy", "steps", "--eval_steps", "5", "--per_device_eval_batch_size", "1",
                             "--num_generations", "16"), CPU, "--per_device_eval_batch_size",
         "per_device_eval_batch_size a multiple of 2", acc8("--eval_strategy", "steps", "--eval_steps", "5",
                                                            "--per_device_eval_batch_size", "2", "--num_generations",
                                                            "16"), CPU),
        ("bf16-and-fp16", acc8("--fp16", "true"), CPU, "--fp16", "only one of bf16 and fp16", acc8(), CPU),
        ("typo-flag", acc8("--num_generatoins", "8"), CPU, "--num_generatoins", "an argument of the script's",
         acc8("--num_generations", "8"), CPU),
        ("bad-choice", acc8("--lr_scheduler_type", "cosine_warm"), CPU, "--lr_scheduler_type", "a value the script's "
         "parser accepts", acc8("--lr_scheduler_type", "cosine"), CPU),
        ("bad-float", acc8("--learning_rate", "1e-6x"), CPU, "--learning_rate", "a value the script's parser accepts",
         acc8("--learning_rate", "1e-6"), CPU),
        ("plateau-without-eval", acc8("--lr_scheduler_type", "reduce_lr_on_plateau"), CPU, "--lr_scheduler_type",
         "change --lr_scheduler_type", acc8("--lr_scheduler_type", "constant"), CPU),
        ("unknown-yaml-key", acc8(config=yaml_with(tmp, replay_tau=5)), CPU, "replay_tau", "a key the script's "
         "dataclasses define", acc8(config=yaml_with(tmp, replay_tau_max=5)), CPU),
        ("multi-gpu-one-process", ["accelerate", "launch", "--multi_gpu", "--num_processes", "1", SYNC, "--config",
                                   SYNC_YAML, "--output_dir", "out"], CPU, "--multi_gpu", "accelerate settings",
         ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", SYNC, "--config", SYNC_YAML, "--output_dir",
          "out"], CPU),
        ("bf16-weights", acc8("--model_init_kwargs", bf16), CPU, "--model_init_kwargs", "dtype: float32",
         acc8("--model_init_kwargs", '{"dtype": "float32"}'), CPU),
        ("async-bf16-weights", acc8("--dtype", "bfloat16", script=ASYNC, config=ASYNC_YAML), CPU, "--dtype",
         "dtype: float32", acc8("--dtype", "float32", script=ASYNC, config=ASYNC_YAML), CPU),
        ("one-process-on-8-gpus", python1(), H100S, "python", "accelerate launch --num_processes 8",
         ["accelerate", "launch", "--num_processes", "8", SYNC, "--config", SYNC_YAML, "--output_dir", "out"], H100S),
        ("old-driver", acc8(), OLD_DRIVER, "NVIDIA driver", "install NVIDIA driver >= 580", acc8(), H100S),
        ("missing-yaml", acc8(config="examples/trl/nope.yaml"), CPU, "--config", "the path of the script's YAML",
         acc8(), CPU),
        ("missing-accelerate-config", ["accelerate", "launch", "--config_file", "nope.yaml", SYNC, "--config",
                                       SYNC_YAML, "--output_dir", "out"], CPU, "--config_file", "or no --config_file",
         ["accelerate", "launch", SYNC, "--config", SYNC_YAML, "--output_dir", "out"], CPU),
    ]


def test_bad_trl_launches_are_refused_naming_the_field_and_their_fix_passes(tmp_path, monkeypatch):
    (tmp_path / "cfgs").mkdir()
    cases = bad_cases(tmp_path / "cfgs")
    assert len(cases) >= 12
    failures = []
    for name, launch, host, field_name, fix, fixed, fixed_host in cases:
        code, out = preflight(launch, monkeypatch, host)
        refused = [line.strip() for line in out.split("REFUSED", 1)[-1].splitlines()[1:]] if "REFUSED" in out else []
        first = refused[0] if refused else ""
        if code != 2 or not first.startswith(f"{field_name}: ") or fix not in first.split("; fix: ", 1)[-1]:
            failures.append(f"{name}: exit {code}, wanted {field_name!r} with fix {fix!r}: {refused or out[-800:]}")
            continue
        code, out = preflight(fixed, monkeypatch, fixed_host)
        if code != 0:
            failures.append(f"{name}: the fixed launch exits {code}: {out[-800:]}")
    assert not failures, "\n".join(failures)


def test_valid_trl_launches_pass(tmp_path, monkeypatch, isolated):
    fsdp2 = tmp_path / "fsdp2.yaml"
    fsdp2.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP",
                                     "mixed_precision": "bf16", "num_machines": 1, "num_processes": 8,
                                     "machine_rank": 0, "fsdp_config": {"fsdp_version": 2}, "use_cpu": False}))
    small = ("--per_device_train_batch_size", "4", "--steps_per_generation", "1", "--gradient_accumulation_steps", "1")
    valid = {
        "sync example, 8 processes": acc8(),
        "async example, 8 processes": acc8(script=ASYNC, config=ASYNC_YAML),
        "per-device 4 on 8 processes (32 rows a generation)": acc8(*small),
        "one process": python1(),
        "two machines of 8": ["accelerate", "launch", "--config_file", MULTI_GPU, "--num_machines", "2",
                              "--num_processes", "16", "--machine_rank", "0", "--main_process_ip", "10.0.0.1",
                              "--main_process_port", "29500", SYNC, "--config", SYNC_YAML, "--output_dir", "out"],
        "bf16 weights under FSDP2 mixed precision": ["accelerate", "launch", "--config_file", str(fsdp2), SYNC,
                                                     "--config", SYNC_YAML, "--output_dir", "out",
                                                     "--model_init_kwargs", '{"dtype": "bfloat16"}'],
        "eval groups over 8 processes": acc8("--eval_strategy", "steps", "--eval_steps", "5",
                                             "--per_device_eval_batch_size", "1"),
    }
    for name, launch in valid.items():
        code, out = preflight(launch, monkeypatch)
        assert code == 0, (name, out[-1500:])
    # accelerate's default config is read when accelerate launch would read it (no --config_file), not otherwise
    isolated.write_text(MULTI_GPU and Path(MULTI_GPU).read_text())
    code, out = preflight(["accelerate", "launch", SYNC, "--config", SYNC_YAML, "--output_dir", "out", *small],
                          monkeypatch)
    assert code == 0 and "8 process(es) on 1 machine(s)" in out and "accelerate's default config" in out, out
    code, out = preflight(["python", SYNC, "--config", SYNC_YAML, "--output_dir", "out", *small], monkeypatch)
    assert code == 2 and "1 process(es)" in out and "--per_device_train_batch_size: " in out, out
