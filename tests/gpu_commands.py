"""The GPU commands the docs and scripts/gpu_smoke.sh give, collected on CPU without running them.

Each `bash gpu|hub|cluster` fence of README.md, docs/*.md and examples/**/README.md runs under bash with recording
stand-ins on PATH for the commands that would start GPU work or installs (grpo-replay, accelerate, python, pip,
ray, vllm, bash): each writes its argv to a JSON-lines file and exits 0. `bash examples/verl/*.sh` is the exception: the
stand-in runs the real script, so what is recorded is the launch it makes (`python -m
grpo_replay.integrations.verl.main <overrides>`), with the script's own variables expanded. `GPU_SMOKE_DRY_RUN=1`
makes gpu_smoke.sh print its commands. Used by tests/docs/test_gpu_commands*.py (main environment; with the TRL
example's paths, accelerate's launch parser and pyproject's requirements they share) and
tests/integrations/verl_integration/test_launch_composition.py (verl environment)."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("examples/**/README.md")])
FENCE = re.compile(r"^```([A-Za-z]*)([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
GPU_TAGS = {"gpu", "hub", "cluster"}
STUBS = ("grpo-replay", "accelerate", "python", "python3", "pip", "pip3", "ray", "vllm", "bash")
VERL_SCRIPTS = "examples/verl/"
TRL_SCRIPT = ROOT / "examples/trl/train_qwen3_math_replay.py"
TRL_YAML = ROOT / "examples/trl/qwen3_0.6b_math_replay.yaml"

_STUB = '''import json, os, sys
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
if name == "bash" and args and args[0].startswith({verl!r}):
    os.execv("/bin/bash", ["/bin/bash", *args])
with open(os.environ["GPU_COMMANDS_RECORD"], "a") as f:
    f.write(json.dumps({{"cmd": name, "argv": args, "source": os.environ.get("GPU_COMMANDS_SOURCE", "")}}) + "\\n")
'''


def gpu_fences() -> list[tuple[str, str]]:
    """(id "path:line", body) of every bash fence tagged gpu, hub or cluster."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            lang, words = m.group(1).lower(), shlex.split(m.group(2))
            if lang in ("bash", "sh") and GPU_TAGS & set(words):
                out.append((f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}", m.group(3)))
    return out


def _stub_dir(tmp: Path) -> Path:
    d = tmp / "stubs"
    d.mkdir(parents=True, exist_ok=True)
    for name in STUBS:
        p = d / name
        p.write_text(f"#!{sys.executable}\n" + _STUB.format(verl=VERL_SCRIPTS))
        p.chmod(0o755)
    return d


def _run(script_or_argv, tmp: Path, source: str, env: dict | None = None) -> list[dict]:
    rec = tmp / "record.jsonl"
    rec.unlink(missing_ok=True)
    e = {**os.environ, **(env or {}), "GPU_COMMANDS_RECORD": str(rec), "GPU_COMMANDS_SOURCE": source,
         "HOME": str(tmp / "home")}
    e["PATH"] = f"{_stub_dir(tmp)}:{e['PATH']}"
    cmd = ["/bin/bash", "-c", script_or_argv] if isinstance(script_or_argv, str) else script_or_argv
    subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=120)
    return [json.loads(line) for line in rec.read_text().splitlines()] if rec.exists() else []


def doc_commands(tmp: Path) -> list[dict]:
    """Every recorded command of the docs' GPU fences: {"cmd", "argv", "source"}."""
    out = []
    for i, (fid, body) in enumerate(gpu_fences()):
        out += _run(body, tmp / f"fence{i}", fid)
    return out


def smoke_commands(tmp: Path) -> dict[str, list[str]]:
    """gpu_smoke.sh's command per path (its dry run): {"builtin": argv, ...}."""
    out = subprocess.run(["/bin/bash", "scripts/gpu_smoke.sh", str(tmp / "smoke")], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "GPU_SMOKE_DRY_RUN": "1"})
    assert out.returncode == 0, out.stderr
    return {line.split("\t")[0]: line.split("\t")[1:] for line in out.stdout.splitlines() if "\t" in line}


def run_with_env(argv: list[str], tmp: Path, source: str) -> list[dict]:
    """Run `env VAR=value ... command` (gpu_smoke's form) under the stand-ins; the recorded commands."""
    env, rest = {}, list(argv)
    if rest and rest[0] == "env":
        rest.pop(0)
        while rest and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", rest[0]):
            k, v = rest.pop(0).split("=", 1)
            env[k] = v
    env.pop("PATH", None)  # the stand-ins stay first on PATH
    return _run(rest, tmp, source, env)


def from_the_checkout(argv: list[str]) -> list[str]:
    """The launch with the checkout's own files (scripts, configs) given by absolute path, so that it resolves from a
    test's folder: every run folder it names relative (train's default runs/<preset>-seed<seed>, a compare's --out, a
    TRL config's output_dir, verl's checkpoints/) is then the test's, never one the checkout's main job wrote."""
    return [str(ROOT / a) if not a.startswith(("-", "runs/", "checkpoints/")) and (ROOT / a).is_file() else a
            for a in argv]


def strip_python_m(argv: list[str], module: str) -> list[str] | None:
    """The arguments after `-m module` of a recorded python call, or None when it runs something else."""
    return argv[2:] if argv[:2] == ["-m", module] else None


def preflight_launches(tmp: Path, verl_entry: str) -> list[tuple[str, str, list[str]]]:
    """Every launch of the docs' GPU fences the preflight takes: (source, kind, argv), kind one of grpo-replay,
    accelerate, verl (the arguments after `python -m verl_entry`)."""
    out = []
    for rec in doc_commands(tmp):
        argv = rec["argv"]
        if rec["cmd"] == "grpo-replay" and argv[:1] in (["train"], ["compare"]):
            out.append((rec["source"], "grpo-replay", argv))
        elif rec["cmd"] == "accelerate" and argv[:1] == ["launch"]:
            out.append((rec["source"], "accelerate", argv))
        elif rec["cmd"] in ("python", "python3") and strip_python_m(argv, verl_entry) is not None:
            out.append((rec["source"], "verl", strip_python_m(argv, verl_entry)))
    return out


def launch_parser():
    """accelerate's own `accelerate launch` parser (imported on use: the verl environment has no accelerate)."""
    from accelerate.commands.launch import launch_command_parser

    return launch_command_parser()


def norm(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject() -> dict:
    """pyproject.toml's [project] table: its dependencies and optional-dependencies (the extras)."""
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
