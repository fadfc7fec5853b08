"""Every install line the docs, scripts and examples give names the extras that bring what its commands import
(the commands collected by tests/gpu_commands.py), and every extra it names exists in pyproject.toml."""
from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import re
import sys
from pathlib import Path

import yaml

import gpu_commands as gc
from gpu_commands import TRL_SCRIPT, TRL_YAML, launch_parser

ROOT = gc.ROOT


# ------------------------------------------------------------------------------------------- install lines
def _provided(extras: set[str]) -> set[str]:
    """Distributions an install of `.[extras]` brings: the named requirements and, for installed ones, their own
    (unconditional) requirements, transitively."""
    from packaging.requirements import Requirement

    proj = gc.pyproject()
    todo = [Requirement(r) for r in proj["dependencies"]]
    for e in extras:
        todo += [Requirement(r) for r in proj["optional-dependencies"][e]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = gc.norm(req.name)
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
    return {gc.norm(dist_of.get(m, [m])[0]) for m in mods}


def _launch_needs(argv: list[str]) -> set[str]:
    """What an `accelerate launch` of an example needs: its script's imports, and its YAML's vLLM and trackers."""
    args = launch_parser().parse_args(argv)
    script_args = args.training_script_args
    cfg = yaml.safe_load((ROOT / script_args[script_args.index("--config") + 1]).read_text())
    return (_needed_dists((ROOT / args.training_script).resolve()) | ({"vllm"} if cfg.get("use_vllm") else set())
            | {gc.norm(t) for t in cfg.get("report_to") or [] if t != "none"})


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
    need = {gc.norm(dist_of[m][0]) for m in APP_EXTRA} | {"vllm"}  # grpo-replay's commands, generator=vllm
    assert not need - provided, need - provided


def test_every_extra_an_install_line_names_exists():
    extras = set(gc.pyproject()["optional-dependencies"])
    pat = re.compile(r"pip install[^\n`]*?-e\s+[\"']?\.\[([a-z_,-]+)\]")
    texts = {p: p.read_text() for p in [*gc.DOCS, *ROOT.glob("scripts/*.sh"), *ROOT.glob("examples/**/*.py"),
                                        *ROOT.glob("src/grpo_replay/**/*.py")]}
    found = [(p, m.group(1)) for p, t in texts.items() for m in pat.finditer(t)]
    assert len(found) >= 5
    for p, group in found:
        assert set(group.split(",")) <= extras, f"{p.relative_to(ROOT)}: .[{group}] names an extra pyproject lacks"

