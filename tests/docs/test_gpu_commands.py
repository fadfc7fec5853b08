"""The GPU commands the docs and scripts/gpu_smoke.sh give are accepted by the code they reach, checked on CPU.

Nothing here runs on a GPU, so what a GPU run would first hit is checked instead: each documented command is
collected (tests/gpu_commands.py) and handed to the real parser and config code (the `grpo-replay` CLI up to the
point where training or generation would start, TRL's own `TrlParser` for the TRL launch, accelerate's config
loader); every install line names the extras its commands import; the pins agree with the engines' declared
ranges. The verl launches are composed with Hydra in the verl environment
(tests/integrations/verl_integration/test_launch_composition.py)."""
from __future__ import annotations

import ast
import importlib.metadata as md
import json
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import gpu_commands as gc

ROOT = gc.ROOT
TRL_SCRIPT = ROOT / "examples/trl/train_qwen3_math_replay.py"
TRL_YAML = ROOT / "examples/trl/qwen3_0.6b_math_replay.yaml"
ASYNC_SCRIPT = ROOT / "examples/trl/train_qwen3_math_async_replay.py"


@pytest.fixture(scope="module")
def doc_records(tmp_path_factory):
    return gc.doc_commands(tmp_path_factory.mktemp("docs"))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return gc.smoke_commands(tmp_path_factory.mktemp("smoke"))


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


def launch_parser():
    from accelerate.commands.launch import launch_command_parser

    return launch_command_parser()


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


# ------------------------------------------------------------------------------------------- gpu_smoke.sh
def test_gpu_smoke_is_valid_bash_and_refuses_without_a_gpu(tmp_path):
    for script in ("scripts/gpu_smoke.sh", "scripts/setup_verl_gpu.sh", "examples/verl/run_paper_single_node.sh",
                   "examples/verl/run_paper_multi_node.sh"):
        assert subprocess.run(["bash", "-n", script], cwd=ROOT).returncode == 0, script
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")  # a driver tool that lists no GPU
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GPU_SMOKE_VENV": str(tmp_path / "venv"),
           "VERL_GPU_VENV": str(tmp_path / "verl-venv")}
    env.pop("GPU_SMOKE_DRY_RUN", None)
    out = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "out")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert "no NVIDIA GPU found" in out.stderr and "bash scripts/test.sh" in out.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "venv").exists()  # nothing made or installed
    bad = subprocess.run(["bash", "scripts/gpu_smoke.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**env, "GPU_SMOKE_PATHS": "builtin vlm"})
    assert bad.returncode == 2 and "unknown path 'vlm'" in bad.stderr
    assert "allowed: testbed builtin trl trl-async verl" in bad.stderr


def test_gpu_smoke_reports_one_line_per_path_and_exit_3_on_a_failure(tmp_path):
    """With a GPU listed and a stand-in python (exit 0, then 1), each path gets its line and its log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    py = bin_dir / "fake-python"
    py.write_text("#!/bin/sh\necho \"ran $*\"\nexit ${FAKE_RC:-0}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(py),
           "GPU_SMOKE_PATHS": "testbed builtin"}
    env.pop("GPU_SMOKE_DRY_RUN", None)
    ok = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "ok")], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=60)
    lines = ok.stdout.splitlines()
    assert ok.returncode == 0 and [l.split()[:2] for l in lines] == [["testbed", "ok"], ["builtin-preflight", "ok"],
                                                                      ["builtin", "ok"], ["builtin-share", "ok"]], ok
    assert "grpo_replay.cli train" in (tmp_path / "ok" / "builtin.log").read_text()
    bad = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "bad")], cwd=ROOT, env={**env, "FAKE_RC": "1"},
                         capture_output=True, text=True, timeout=60)
    # a refused preflight skips its path: nothing of it runs on the GPU
    assert bad.returncode == 3 and [l.split()[:2] for l in bad.stdout.splitlines()] == [["testbed", "FAILED"],
                                                                                      ["builtin-preflight", "FAILED"]]
    assert f"log {tmp_path / 'bad' / 'builtin-preflight.log'}" in bad.stdout


def test_gpu_smoke_preflights_pass_on_cpu(smoke, tmp_path, capsys):
    """Each GPU path's own preflight (run first by gpu_smoke.sh) accepts its launch, checked here for one 80 GB
    card; the verl path's data is what its verl-data step writes (stand-in files here)."""
    from grpo_replay.cli import main

    for name in ("builtin-preflight", "trl-preflight", "trl-async-preflight", "verl-preflight"):
        argv = smoke[name]
        i = argv.index("preflight")
        launch = [a.replace(str(ROOT / "runs"), str(tmp_path)) for a in argv[i + 1:]]
        for a in launch:
            if a.startswith("DATA="):
                Path(a[5:]).mkdir(parents=True, exist_ok=True)
                for split in ("train", "test"):
                    (Path(a[5:]) / f"{split}.parquet").write_bytes(b"")
        code = main(["preflight", "--gpu-memory", "80", *launch])
        assert code == 0, (name, capsys.readouterr())


def test_gpu_smoke_takes_an_absolute_verl_venv(tmp_path):
    """The verl path puts VERL_GPU_VENV's bin first on PATH whether it is absolute or relative to the checkout."""
    for venv, want in ((str(tmp_path / "verl-gpu"), str(tmp_path / "verl-gpu/bin")),
                       (".venv-verl-gpu", str(ROOT / ".venv-verl-gpu/bin"))):
        out = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, env={**os.environ, "GPU_SMOKE_DRY_RUN": "1",
                                                         "VERL_GPU_VENV": venv, "GPU_SMOKE_PATHS": "verl"})
        verl = next(line.split("\t")[1:] for line in out.stdout.splitlines() if line.startswith("verl\t"))
        path = next(a for a in verl if a.startswith("PATH="))
        assert path.removeprefix("PATH=").split(":")[0] == want, path


def test_setup_verl_gpu_builds_flash_attn_for_the_host_gpu_only(tmp_path):
    """The flash-attn build gets the host's architecture (nvidia-smi's compute_cap 9.0 -> 90), not every one."""
    venv, bin_dir = tmp_path / "venv", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    rec = tmp_path / "pip.log"
    py = venv / "bin/python"
    py.write_text(f"#!/bin/sh\necho \"$FLASH_ATTN_CUDA_ARCHS|$TORCH_CUDA_ARCH_LIST|$*\" >> {rec}\n")
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 9.0\necho 9.0\n")
    for f in (py, smi):
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "VERL_GPU_VENV": str(venv)}
    for k in ("FLASH_ATTN_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST"):
        env.pop(k, None)
    out = subprocess.run(["bash", "scripts/setup_verl_gpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    (flash,) = [line for line in rec.read_text().splitlines() if "flash-attn==" in line]
    assert flash.startswith("90|9.0|"), flash
    assert "FLASH_ATTN_CUDA_ARCHS=90" in out.stderr


# The stand-in python of the runs below: it writes the run's log as the engine would (metrics.jsonl, TRL's
# trainer_state.json, verl's file logger at VERL_FILE_LOGGER_PATH when trainer.logger names "file"), serves /health
# as the vLLM server until stopped, and runs the real share checker.
_FAKE_PYTHON = """#!{python}
import json, os, sys, pathlib, subprocess
args = sys.argv[1:]
if args and args[0] == "scripts/check_replay_share.py":
    sys.exit(subprocess.run([{python!r}, *args]).returncode)
if "preflight" in args or args[:1] == ["-"]:  # a preflight; the verl-data step's script on stdin
    sys.exit(0)
if args[:2] == ["-m", "vllm.entrypoints.cli.main"]:
    import http.server
    pathlib.Path(os.environ["FAKE_SERVER_PID"]).write_text(str(os.getpid()))
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Health).serve_forever()
if os.environ.get("FAKE_TRAIN_RC"):
    sys.exit(int(os.environ["FAKE_TRAIN_RC"]))
shares = [float(x) for x in os.environ["FAKE_SHARES"].split()]
rows = [{{"step": i + 1, "replay/share": s, "replay/count": 8.0 * s / (1 - s)}} for i, s in enumerate(shares)]
if args[:2] == ["-m", "grpo_replay.integrations.verl.main"]:
    loggers = [a for a in args if a.startswith("trainer.logger=")][-1]
    if '"file"' in loggers:
        pathlib.Path(os.environ["VERL_FILE_LOGGER_PATH"]).write_text(
            "".join(json.dumps({{"step": r["step"], "data": r}}) + "\\n" for r in rows))
    sys.exit(0)
out = pathlib.Path(args[args.index("--out" if "--out" in args else "--output_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
if "--out" in args:
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
else:
    (out / "trainer_state.json").write_text(json.dumps({{"log_history": rows}}))
"""


def _fake_gpu_host(tmp_path, gpus: int = 2) -> dict:
    """nvidia-smi listing `gpus` GPUs, the stand-in python (also verl's environment's), a free server port."""
    import socket

    bin_dir = tmp_path / "bin"
    (tmp_path / "verl-venv/bin").mkdir(parents=True)
    bin_dir.mkdir()
    smi = "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})'\n" for i in range(gpus))
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + smi)
    py = bin_dir / "fake-python"
    py.write_text(_FAKE_PYTHON.format(python=sys.executable))
    (tmp_path / "verl-venv/bin/python").write_text(py.read_text())
    for f in (*bin_dir.iterdir(), tmp_path / "verl-venv/bin/python"):
        f.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(py),
           "VERL_GPU_VENV": str(tmp_path / "verl-venv"), "GPU_SMOKE_VLLM_PORT": str(port),
           "FAKE_SERVER_PID": str(tmp_path / "server.pid")}
    env.pop("GPU_SMOKE_DRY_RUN", None)
    return env


def _server_gone(tmp_path) -> bool:
    pid = int((tmp_path / "server.pid").read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("path", ["builtin", "trl", "trl-async", "verl"])
def test_gpu_smoke_fails_a_run_that_replays_nothing(tmp_path, path):
    """Every training path passes on its realised replay share, not on the exit code: a stand-in run that exits 0
    having replayed nothing (or a third short of the ratio) fails its share line and the script (exit 3); one that
    replayed ratio/(1+ratio) passes. The trl-async path's server is up before its run and gone after it."""
    env = {**_fake_gpu_host(tmp_path), "GPU_SMOKE_PATHS": path}
    before = {"trl-async": [["trl-async-preflight", "ok"], ["trl-async-server", "ok"]],
              "verl": [["verl-data", "ok"], ["verl-preflight", "ok"]]}.get(path, [[f"{path}-preflight", "ok"]])
    for shares, rc in (("0 0 0", 3), ("0 0.2222 0.2222", 3), ("0 0.3333 0.3333", 0)):
        out = tmp_path / f"out-{rc}-{shares.replace(' ', '_')}"
        run = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(out)], cwd=ROOT, capture_output=True, text=True,
                             timeout=120, env={**env, "FAKE_SHARES": shares})
        lines = [l.split()[:2] for l in run.stdout.splitlines()]
        assert lines == [*before, [path, "ok"], [f"{path}-share", "ok" if rc == 0 else "FAILED"]], (shares, run)
        assert run.returncode == rc, (shares, run)
        if rc:
            assert "check_replay_share" in (out / f"{path}-share.log").read_text()
        if path == "trl-async":
            assert _server_gone(tmp_path)


def test_gpu_smoke_trl_async_stops_its_server_when_the_run_fails(tmp_path):
    env = {**_fake_gpu_host(tmp_path), "GPU_SMOKE_PATHS": "trl-async", "FAKE_TRAIN_RC": "1"}
    run = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env=env)
    assert [l.split()[:2] for l in run.stdout.splitlines()] == [["trl-async-preflight", "ok"],
                                                                ["trl-async-server", "ok"], ["trl-async", "FAILED"]]
    assert run.returncode == 3 and _server_gone(tmp_path), run


def test_gpu_smoke_skips_trl_async_on_one_gpu(tmp_path):
    """One GPU: the preflight runs, the path is skipped with its reason, no server is started, the script passes."""
    env = {**_fake_gpu_host(tmp_path, gpus=1), "GPU_SMOKE_PATHS": "trl-async"}
    run = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env=env)
    lines = run.stdout.splitlines()
    assert [l.split()[:2] for l in lines] == [["trl-async-preflight", "ok"], ["trl-async", "skipped"]], run
    assert "needs 2 GPUs" in lines[1] and run.returncode == 0
    assert not (tmp_path / "server.pid").exists() and not (tmp_path / "out/trl-async-server.log").exists()


# ------------------------------------------------------------------------------------------- install lines
def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pyproject():
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _provided(extras: set[str]) -> set[str]:
    """Distributions an install of `.[extras]` brings: the named requirements and, for installed ones, their own
    (unconditional) requirements, transitively."""
    from packaging.requirements import Requirement

    proj = _pyproject()
    todo = [Requirement(r) for r in proj["dependencies"]]
    for e in extras:
        todo += [Requirement(r) for r in proj["optional-dependencies"][e]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        for r in map(Requirement, reqs):
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r)
    return seen


def _imports(path: Path, all_levels: bool) -> set[str]:
    """Top-level module names `path` imports (every import, or only the module-level ones)."""
    tree = ast.parse(path.read_text())
    nodes = ast.walk(tree) if all_levels else tree.body
    names = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            names.add(n.module)
    return names


def _needed_dists(script: Path) -> set[str]:
    """Distributions `script` imports: all of its own imports and its sibling modules' (examples import each
    other), grpo_replay's module-level imports transitively."""
    dist_of = {k: v for k, v in md.packages_distributions().items()}
    todo, seen, mods = [(script, True)], set(), set()
    while todo:
        path, all_levels = todo.pop()
        for name in _imports(path, all_levels):
            top = name.split(".")[0]
            sibling = script.parent / f"{top}.py"
            if sibling.exists():
                if str(sibling) not in seen:
                    seen.add(str(sibling))
                    todo.append((sibling, True))
                continue
            if top == "grpo_replay":
                spec = importlib.util.find_spec(name)
                if spec and spec.origin and spec.origin not in seen:
                    seen.add(spec.origin)
                    todo.append((Path(spec.origin), False))
                continue
            if top not in sys.stdlib_module_names and top != "__future__":
                mods.add(top)
    return {_norm(dist_of.get(m, [m])[0]) for m in mods}


def _launch_needs(argv: list[str]) -> set[str]:
    """What an `accelerate launch` of an example needs: its script's imports, and its YAML's vLLM and trackers."""
    args = launch_parser().parse_args(argv)
    script_args = args.training_script_args
    cfg = yaml.safe_load((ROOT / script_args[script_args.index("--config") + 1]).read_text())
    return (_needed_dists((ROOT / args.training_script).resolve()) | ({"vllm"} if cfg.get("use_vllm") else set())
            | {_norm(t) for t in cfg.get("report_to") or [] if t != "none"})


def _extras_of(line: str) -> set[str]:
    return set(re.search(r"\.\[([a-z,]+)\]", line).group(1).split(","))


def test_trl_example_install_lines_name_every_extra_it_imports(doc_records):
    """Each fence that installs and launches: the extras on its pip line bring everything its launches import,
    vLLM where it serves or generates with vLLM, and the YAML's trackers; so do the scripts' own "Needs" lines."""
    fences: dict[str, dict] = {}
    for r in doc_records:
        f = fences.setdefault(r["source"], {"pip": [], "need": set()})
        if r["cmd"] == "pip" and "-e" in r["argv"]:
            f["pip"].append(r["argv"][-1])
        elif r["cmd"] == "accelerate" and r["argv"][:1] == ["launch"]:
            f["need"] |= _launch_needs(r["argv"][1:])
        elif r["cmd"] == "vllm":
            f["need"].add("vllm")
    checked = {k: f for k, f in fences.items() if f["pip"] and f["need"]}
    assert len(checked) >= 2, fences.keys()  # the colocate example and the async (server) one
    for where, f in checked.items():
        assert {"trl", "math-verify", "vllm"} <= f["need"], (where, f["need"])
        for line in f["pip"]:
            missing = f["need"] - _provided(_extras_of(line))
            assert not missing, f"{where}: pip install -e '{line}' lacks {missing}"
    for script in ("train_qwen3_math_replay.py", "train_qwen3_math_async_replay.py"):
        text = (ROOT / "examples/trl" / script).read_text()
        line = re.search(r"pip install -e '(\.\[[a-z,]+\])'", text).group(1)
        launch = re.search(r"accelerate launch[^\n]*\\\n\s*(examples/\S+\.py --config \S+\.yaml)", text).group(1)
        need = _launch_needs(launch.split())
        assert not need - _provided(_extras_of(line)), f"{script}: {line} lacks {need - _provided(_extras_of(line))}"
    smoke = re.search(r"pip install -q -e '(\.\[[a-z,]+\])'", (ROOT / "scripts/gpu_smoke.sh").read_text()).group(1)
    need = _launch_needs([str(TRL_SCRIPT), "--config", str(TRL_YAML)])
    assert not need - _provided(_extras_of(smoke)), f"scripts/gpu_smoke.sh: {smoke}"
    # The check can fail: the install line these examples used to give lacks the reward's package and the tracker.
    assert {"math-verify", "tensorboard"} <= need - _provided({"trl", "vllm"})


def test_readme_gpu_install_line_names_the_app_and_vllm_extras():
    from grpo_replay.cli import APP_EXTRA

    line = re.search(r'GPU: `pip install -e "\.\[([a-z,]+)\]"`', (ROOT / "README.md").read_text())
    assert line, "README.md: the GPU install line"
    provided = _provided(set(line.group(1).split(",")))
    dist_of = md.packages_distributions()
    need = {_norm(dist_of[m][0]) for m in APP_EXTRA} | {"vllm"}  # grpo-replay's commands, generator=vllm
    assert not need - provided, need - provided


def test_every_extra_an_install_line_names_exists():
    extras = set(_pyproject()["optional-dependencies"])
    pat = re.compile(r"pip install[^\n`]*?-e\s+[\"']?\.\[([a-z_,-]+)\]")
    texts = {p: p.read_text() for p in [*gc.DOCS, *ROOT.glob("scripts/*.sh"), *ROOT.glob("examples/**/*.py"),
                                        *ROOT.glob("src/grpo_replay/**/*.py")]}
    found = [(p, m.group(1)) for p, t in texts.items() for m in pat.finditer(t)]
    assert len(found) >= 5
    for p, group in found:
        assert set(group.split(",")) <= extras, f"{p.relative_to(ROOT)}: .[{group}] names an extra pyproject lacks"


# ------------------------------------------------------------------------------------------- pins
def _spec(requirements: list[str], name: str):
    from packaging.requirements import Requirement

    return next(Requirement(r).specifier for r in requirements if _norm(Requirement(r).name) == name)


def test_vllm_extra_is_the_range_trl_declares():
    """pyproject's vllm extra admits exactly the vLLM versions the installed TRL declares for its own vllm extra."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    ours = _spec(_pyproject()["optional-dependencies"]["vllm"], "vllm")
    trl_reqs = [r for r in md.requires("trl") if "extra ==" in r and Requirement(r).marker.evaluate({"extra": "vllm"})]
    theirs = _spec(trl_reqs, "vllm")
    grid = [Version(f"0.{minor}.{patch}") for minor in range(5, 45) for patch in range(4)]
    assert [v for v in grid if v in ours] == [v for v in grid if v in theirs], (str(ours), str(theirs))


def test_trl_extra_is_the_line_the_integration_supports():
    from packaging.version import Version

    from grpo_replay.integrations.trl import SUPPORTED_TRL, SUPPORTED_TRL_TEXT

    ours = _spec(_pyproject()["optional-dependencies"]["trl"], "trl")
    grid = [Version(f"1.{minor}.{patch}") for minor in range(12, 20) for patch in range(5)]
    assert {(v.major, v.minor) for v in grid if v in ours} == set(SUPPORTED_TRL)
    assert Version(md.version("trl")) in ours and SUPPORTED_TRL_TEXT.startswith("trl>=1.16")


def test_vllm_install_hint_names_the_pinned_extra():
    from grpo_replay.generation.vllm import INSTALL_HINT

    assert "'.[vllm]'" in INSTALL_HINT and "0.31" in INSTALL_HINT
