"""The GPU commands the docs and scripts/gpu_smoke.sh give are accepted by the code they reach, checked on CPU.

Nothing here runs on a GPU, so what a GPU run would first hit is checked instead: each documented command is
collected (tests/gpu_commands.py) and handed to the real parser and config code (the `grpo-replay` CLI up to the
point where training or generation would start, TRL's own `TrlParser` for the TRL launch, accelerate's config
loader); the pins agree with the engines' declared ranges. Beside this file: gpu_smoke.sh itself
(test_gpu_commands_smoke.py) and the install lines (test_gpu_commands_install.py). The verl launches are composed
with Hydra in the verl environment (tests/integrations/verl_integration/test_launch_composition.py)."""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

import gpu_commands as gc
from gpu_commands import TRL_SCRIPT, TRL_YAML, launch_parser

ROOT = gc.ROOT
ASYNC_SCRIPT = ROOT / "examples/trl/train_qwen3_math_async_replay.py"


def _grpo_replay_calls(records) -> list[tuple[str, list[str]]]:
    return [(r["source"], r["argv"]) for r in records if r["cmd"] == "grpo-replay"]


def test_the_collection_sees_every_kind_of_command(doc_records, smoke):
    """Guard against a harness that silently collects nothing."""
    kinds = {(r["cmd"], (r["argv"] or [""])[0]) for r in doc_records}
    assert {("grpo-replay", "compare"), ("grpo-replay", "train"), ("grpo-replay", "eval"), ("accelerate", "launch"),
            ("pip", "install")} <= kinds, kinds
    verl = [r for r in doc_records if gc.strip_python_m(r["argv"], "grpo_replay.integrations.verl.main") is not None]
    assert len(verl) >= 6  # README, paper_table and verl.md's five variants
    assert set(smoke) == {"testbed", "builtin-preflight", "builtin", "builtin-share", "trl-preflight", "trl",
                          "trl-share", "trl-async-preflight", "trl-async-server", "trl-async", "trl-async-share",
                          "verl-data", "verl-preflight", "verl", "verl-share"}


# ------------------------------------------------------------------------------------------- grpo-replay CLI
class _Reached(Exception):
    """Raised where a command would start training or generating: everything before it accepted the input."""


def _check_cli(argv: list[str], monkeypatch, tmp_path):
    """Run `grpo-replay ARGV` up to the compute; returns what reached it (a TrainConfig, EvalSettings or 0)."""
    from grpo_replay.cli import main

    tmp_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(tmp_path)
    if argv[0] == "compare":
        return main([*argv, "--dry-run"])  # plans every run: config, arms, backend checks, benchmark settings
    if argv[0] == "preflight":  # computes and writes nothing (tests/preflight tests its reports), from the test's folder
        return main(gc.from_the_checkout(argv))
    if argv[0] == "train":
        from grpo_replay.trainer import loop, train_config
        from grpo_replay.trainer.trl import backend as trl_backend

        def reached(cfg):
            raise _Reached(cfg)

        monkeypatch.setattr(train_config, "check_machine", lambda cfg: None)  # no CUDA, no vLLM here
        monkeypatch.setattr(loop, "train", reached)
        monkeypatch.setattr(trl_backend, "train_with_trl", reached)
    elif argv[0] == "eval":
        from grpo_replay.cli import evaluate
        from grpo_replay.eval import benchmark_report

        monkeypatch.setattr(benchmark_report, "load_results", lambda path: {})  # a baseline an earlier GPU step writes
        monkeypatch.setattr(evaluate, "_evaluate", lambda args, settings, baseline: (_ for _ in ()).throw(_Reached(settings)))
    with pytest.raises(_Reached) as got:
        main(argv)
    return got.value.args[0]


def test_documented_grpo_replay_commands_are_accepted(doc_records, monkeypatch, tmp_path, capsys):
    calls = _grpo_replay_calls(doc_records)
    for i, (source, argv) in enumerate(calls):
        got = _check_cli(argv, monkeypatch, tmp_path / str(i))
        assert got == 0 or got is not None, f"{source}: grpo-replay {' '.join(argv)}\n{capsys.readouterr().err}"
        if argv[0] == "compare":
            assert got == 0, f"{source}: grpo-replay {' '.join(argv)} exits {got}\n{capsys.readouterr().err}"
    trl_variant = [argv for _, argv in calls if argv[0] == "compare" and "--backend" in argv
                   and argv[argv.index("--backend") + 1] == "trl"]
    assert trl_variant and "generator=vllm" in trl_variant[0]  # the paper recipe's TRL variant is among them


def test_gpu_smoke_builtin_vllm_command_is_accepted(smoke, monkeypatch, tmp_path):
    argv = smoke["builtin"]
    i = argv.index("-m")
    assert argv[i + 1] == "grpo_replay.cli"
    cfg = _check_cli(argv[i + 2 :], monkeypatch, tmp_path)
    assert cfg.generator == "vllm" and cfg.device == "cuda" and cfg.backend == "builtin" and cfg.steps == 3


# ------------------------------------------------------------------------------------------- TRL launches
def _trl_script():
    spec = importlib.util.spec_from_file_location("train_qwen3_math_replay", TRL_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _check_accelerate_launch(argv: list[str]):
    """accelerate's own parser and config loader, then TRL's parser on the script's arguments (on CPU:
    --use_cpu true, since bf16 needs a GPU to validate). Returns (accelerate config, ReplayGRPOConfig)."""
    pytest.importorskip("trl")
    from accelerate.commands.config.config_args import load_config_from_file
    from trl import ModelConfig, TrlParser

    from grpo_replay.integrations.trl import ReplayGRPOConfig

    args = launch_parser().parse_args(argv)
    acc = load_config_from_file(args.config_file)
    assert Path(args.training_script).resolve() == TRL_SCRIPT
    script = _trl_script()
    _, training, model = TrlParser((script.ScriptArguments, ReplayGRPOConfig, ModelConfig)).parse_args_and_config(
        [*args.training_script_args, "--use_cpu", "true"])
    return args, acc, training, model, script


def _launches(records, script: Path) -> list[list[str]]:
    """The `accelerate launch` arguments of every recorded launch of `script`."""
    out = []
    for r in records:
        if r["cmd"] == "accelerate" and r["argv"][:1] == ["launch"]:
            args = launch_parser().parse_args(r["argv"][1:])
            if Path(args.training_script).resolve() == script:
                out.append(r["argv"][1:])
    return out


def test_documented_trl_launches_parse_with_trl_and_accelerate(doc_records):
    from grpo_replay import ReplayConfig

    launches = _launches(doc_records, TRL_SCRIPT)
    assert len(launches) == 2
    presets = []
    for argv in launches:
        args, acc, training, model, script = _check_accelerate_launch(argv)
        assert acc.distributed_type == "MULTI_GPU" and args.num_processes == 8
        assert training.use_vllm and training.vllm_mode == "colocate" and training.report_to == ["tensorboard"]
        assert training.bf16 and model.model_name_or_path == "Qwen/Qwen3-0.6B-Base"
        presets.append(training.replay_preset)
        # Each arm runs its preset: no key of the YAML overrides it (a replay_ratio there made the GRPO arm replay).
        assert training.to_replay_config() == ReplayConfig.from_preset(training.replay_preset), training.replay_preset
        # What the launch needs besides vLLM (absent on CPU) is installed with the extras its install line names.
        assert script.preflight(training) == ["use_vllm needs the `vllm` package: pip install -e '.[vllm]' in the "
                                              "grpo-replay checkout"]
    assert presets == ["paper", "grpo"]  # the baseline launch's override takes effect


def test_every_key_of_the_trl_yaml_is_a_config_field():
    from trl import ModelConfig

    from grpo_replay.integrations.trl import ReplayGRPOConfig

    fields = {*ReplayGRPOConfig.__dataclass_fields__, *ModelConfig.__dataclass_fields__,
              *_trl_script().ScriptArguments.__dataclass_fields__}
    keys = yaml.safe_load(TRL_YAML.read_text())
    assert len(keys) > 30 and not set(keys) - fields, set(keys) - fields


def test_every_key_of_the_async_trl_yaml_is_a_config_field(monkeypatch):
    from grpo_replay.integrations.trl import ReplayAsyncGRPOConfig

    monkeypatch.syspath_prepend(str(TRL_SCRIPT.parent))  # it imports the synchronous example's reward
    spec = importlib.util.spec_from_file_location("train_qwen3_math_async_replay",
                                                  TRL_SCRIPT.parent / "train_qwen3_math_async_replay.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    fields = {*ReplayAsyncGRPOConfig.__dataclass_fields__, *mod.AsyncScriptArguments.__dataclass_fields__}
    keys = yaml.safe_load((TRL_SCRIPT.parent / "qwen3_0.6b_math_async_replay.yaml").read_text())
    assert len(keys) > 20 and not set(keys) - fields, set(keys) - fields
    # `--replay_preset grpo` (the YAML's own comment) gives the GRPO arm: no replay_* key of the YAML overrides it.
    assert not {k for k in keys if k.startswith("replay_")} - {"replay_preset"}
    assert keys["report_to"] == ["tensorboard"]


def test_gpu_smoke_trl_command_parses(smoke):
    argv = smoke["trl"]
    i = argv.index("accelerate.commands.launch")
    args, _, training, model, _ = _check_accelerate_launch(argv[i + 1 :])
    assert args.num_processes == 2 and training.max_steps == 2 and training.report_to == []
    # one process's share of a generation: 8 rows = 2 prompts x 4 completions (TRL multiplies by the processes)
    assert training.generation_batch_size == 8 and training.num_generations == 4 and training.steps_per_generation == 1


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_gpu_smoke_trl_async_command_parses(smoke, monkeypatch):
    """The async path: the launch parses with accelerate's parser and the async script's own TrlParser, talks to the
    server the path starts (same port, model and dtype, another GPU), plans the paper ratio's third exactly, and its
    run is the one the share line checks."""
    from accelerate.commands.launch import launch_command_parser
    from trl import TrlParser

    from grpo_replay.integrations.trl import ReplayAsyncGRPOConfig

    launch, server = smoke["trl-async"], smoke["trl-async-server"]
    i = launch.index("accelerate.commands.launch")
    args = launch_command_parser().parse_args(launch[i + 1 :])
    assert Path(args.training_script).resolve() == ASYNC_SCRIPT and args.num_processes == 1
    monkeypatch.syspath_prepend(str(ASYNC_SCRIPT.parent))  # it imports the synchronous example's reward
    spec = importlib.util.spec_from_file_location("train_qwen3_math_async_replay", ASYNC_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    script_args, training = TrlParser((mod.AsyncScriptArguments, ReplayAsyncGRPOConfig)).parse_args_and_config(
        [*args.training_script_args, "--use_cpu", "true"])
    assert training.max_steps == 3 and training.report_to == [] and training.replay_preset == "paper"
    # 12 samples a step = 8 fresh (two groups of 4) + 4 replayed: the share 1/3 exactly, after a one-step warm-up
    assert training.per_device_train_batch_size * training.gradient_accumulation_steps == 12
    assert training.num_generations == 4 and training.replay_warmup_steps == 1
    j = server.index("vllm.entrypoints.cli.main")
    assert server[j + 1 : j + 3] == ["serve", script_args.model_name_or_path]
    assert training.vllm_server_base_url == f"http://127.0.0.1:{_value(server, '--port')}"
    assert _value(server, "--dtype") == training.dtype == "float32"
    assert json.loads(_value(server, "--weight-transfer-config")) == {"backend": "nccl"}
    assert "VLLM_SERVER_DEV_MODE=1" in server
    devices = {a for a in server + launch if a.startswith("CUDA_VISIBLE_DEVICES=")}
    assert devices == {"CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES=1"}, devices  # NCCL: one rank a device
    share = smoke["trl-async-share"]
    assert share[1:] == ["scripts/check_replay_share.py", training.output_dir, "--ratio", "0.5"], share


def test_preflight_names_the_extra_of_each_missing_package(monkeypatch):
    script = _trl_script()
    args = type("A", (), {"use_vllm": True, "report_to": ["wandb", "tensorboard"]})()
    real = importlib.util.find_spec
    monkeypatch.setattr(script.importlib.util, "find_spec",
                        lambda name: None if name in ("math_verify", "wandb", "vllm") else real(name))
    assert script.preflight(args) == [
        "the reward needs the `math_verify` package: pip install -e '.[app]' in the grpo-replay checkout",
        "use_vllm needs the `vllm` package: pip install -e '.[vllm]' in the grpo-replay checkout",
        "report_to wandb needs the `wandb` package: pip install -e '.[wandb]' in the grpo-replay checkout",
    ]
    # The async recipe calls the same preflight with ReplayAsyncGRPOConfig, which has no use_vllm (its server is vLLM).
    async_args = type("A", (), {"report_to": ["wandb"]})()
    assert script.preflight(async_args) == [
        "the reward needs the `math_verify` package: pip install -e '.[app]' in the grpo-replay checkout",
        "report_to wandb needs the `wandb` package: pip install -e '.[wandb]' in the grpo-replay checkout",
    ]
    assert "missing = preflight(training_args)" in (ROOT / "examples/trl/train_qwen3_math_async_replay.py").read_text()



# ------------------------------------------------------------------------------------------- pins
def _spec(requirements: list[str], name: str):
    from packaging.requirements import Requirement

    return next(Requirement(r).specifier for r in requirements if gc.norm(Requirement(r).name) == name)


def test_vllm_extra_is_the_range_trl_declares():
    """pyproject's vllm extra admits exactly the vLLM versions the installed TRL declares for its own vllm extra."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    ours = _spec(gc.pyproject()["optional-dependencies"]["vllm"], "vllm")
    trl_reqs = [r for r in md.requires("trl") if "extra ==" in r and Requirement(r).marker.evaluate({"extra": "vllm"})]
    theirs = _spec(trl_reqs, "vllm")
    grid = [Version(f"0.{minor}.{patch}") for minor in range(5, 45) for patch in range(4)]
    assert [v for v in grid if v in ours] == [v for v in grid if v in theirs], (str(ours), str(theirs))


def test_trl_extra_is_the_line_the_integration_supports():
    from packaging.version import Version

    from grpo_replay.integrations.trl import SUPPORTED_TRL, SUPPORTED_TRL_TEXT

    ours = _spec(gc.pyproject()["optional-dependencies"]["trl"], "trl")
    grid = [Version(f"1.{minor}.{patch}") for minor in range(12, 20) for patch in range(5)]
    assert {(v.major, v.minor) for v in grid if v in ours} == set(SUPPORTED_TRL)
    assert Version(md.version("trl")) in ours and SUPPORTED_TRL_TEXT.startswith("trl>=1.16")


def test_vllm_install_hint_names_the_pinned_extra():
    from grpo_replay.generation.vllm import INSTALL_HINT

    assert "'.[vllm]'" in INSTALL_HINT and "0.31" in INSTALL_HINT
