"""The package's layers: `import grpo_replay` needs only torch and numpy, no core module imports a layer above it,
and the layers above the core import each other in one direction only (`LAYERS`).

The core is every module at the package's top level; everything else lives in a subpackage (an app layer or an
integration). A module added at the top level is core and held to these rules at once.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "src" / "grpo_replay"
FORBIDDEN_LIBS = ("yaml", "transformers", "datasets", "matplotlib", "math_verify", "tqdm", "accelerate", "trl",
                  "verl", "vllm", "safetensors")


def app_packages() -> set[str]:
    return {p.parent.name for p in PKG.glob("*/__init__.py")}


def top_level_modules() -> set[str]:
    return {p.stem for p in PKG.glob("*.py") if p.stem != "__main__"}


def core_modules() -> set[str]:
    return top_level_modules()  # __init__ included: `import grpo_replay` is the core's public API


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in `path`, relative imports resolved against the package."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = "grpo_replay" + (f".{node.module}" if node.module else "")
                names = [base] if node.module else [f"grpo_replay.{a.name}" for a in node.names]
                out += [(node.lineno, n) for n in names]
            else:
                out.append((node.lineno, node.module or ""))
    return out


def test_the_layers_are_folders():
    assert {"buffer", "config", "loss", "rollout", "errors", "validation"} <= core_modules()
    # The layers above the core, each a folder; a new one is a decision about the architecture, so it is named here.
    assert app_packages() == {"app", "cli", "generation", "trainer", "eval", "experiments", "tasks", "plotting",
                              "integrations", "preflight"}


def test_no_core_module_imports_an_app_layer_or_a_heavy_library():
    offences = []
    for name in sorted(core_modules()):
        path = PKG / f"{name}.py"
        for line, mod in imported_names(path):
            parts = mod.split(".")
            if parts[0] in FORBIDDEN_LIBS:
                offences.append(f"{path.name}:{line} imports {mod}")
            if parts[0] == "grpo_replay" and len(parts) > 1 and parts[1] in app_packages():
                offences.append(f"{path.name}:{line} imports {mod} (an app layer)")
    assert not offences, "the core must import only torch, numpy and itself:\n" + "\n".join(offences)


# The layers above the core, lowest first. A module may import the core, its own layer, and the layers of earlier
# tiers; never a later tier, nor another layer of its own tier. So every arrow between layers runs one way (down):
# app is what every layer shares (config files, data and model loading, tracking); plotting draws plain data;
# generation samples; integrations adapt TRL and verl to the core; eval grades and measures (generation, plots);
# tasks are the verifiable tasks (eval's grading, generation's sampler); the trainer runs them (and the TRL
# integration); experiments compare trained runs; the preflight resolves a launch of any of them before it runs;
# the command line drives everything.
LAYERS = (("app",), ("plotting", "generation", "integrations"), ("eval",), ("tasks",), ("trainer",), ("experiments",),
          ("preflight",), ("cli",))
TIER = {layer: i for i, tier in enumerate(LAYERS) for layer in tier}


def package_imports(path: Path, pkg: Path = PKG) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in `path` (inside functions too), relative imports resolved
    against the file's own package under `pkg`."""
    package = ["grpo_replay", *path.relative_to(pkg).parent.parts]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            out += [(node.lineno, base)] if node.module else [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, node.module or ""))
    return out


def layer_offences(pkg: Path = PKG) -> list[str]:
    """Every import from one app layer into a later tier, or into another layer of its own tier."""
    offences = []
    for path in sorted(pkg.glob("*/**/*.py")):
        layer = path.relative_to(pkg).parts[0]
        for line, mod in package_imports(path, pkg):
            parts = mod.split(".")
            if parts[0] != "grpo_replay" or len(parts) < 2 or parts[1] not in TIER or parts[1] == layer:
                continue
            if TIER[parts[1]] >= TIER[layer]:
                offences.append(f"{path.relative_to(pkg)}:{line} imports {mod} ({layer} -> {parts[1]} runs "
                                f"{'up' if TIER[parts[1]] > TIER[layer] else 'across a tier'})")
    return offences


def test_every_app_layer_has_a_place_in_the_order():
    assert set(TIER) == app_packages()


def test_app_layers_import_each_other_in_one_direction():
    offences = layer_offences()
    assert not offences, "an arrow runs back up between app layers (see LAYERS):\n" + "\n".join(offences)


def test_the_order_check_sees_an_upward_import(tmp_path):
    """The check itself: a copy of the package with one lazy upward import (app -> eval, inside a function) and
    one across a tier (plotting -> generation) is refused, naming both."""
    import shutil

    copy = tmp_path / "grpo_replay"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "app" / "answers.py").write_text((copy / "app" / "answers.py").read_text()
                                              + "\n\ndef _up():\n    from ..eval import grading\n")
    (copy / "plotting" / "benchmarks.py").write_text((copy / "plotting" / "benchmarks.py").read_text()
                                                    + "\nfrom grpo_replay.generation import SamplingParams\n")
    offences = layer_offences(copy)
    assert len(offences) == 2, offences
    assert "app/answers.py" in offences[0] and "grpo_replay.eval (app -> eval runs up)" in offences[0]
    assert "plotting/benchmarks.py" in offences[1] and "(plotting -> generation runs across a tier)" in offences[1]


BLOCKER = """
import sys
BLOCKED = set(sys.argv[1].split(","))

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked by the boundary test: {name}")
        return None

sys.meta_path.insert(0, Block())
import torch
from grpo_replay import ReplayBuffer, ReplayConfig, RolloutBatch, compose_batch, group_advantages, ppo_clip_loss, LossConfig

rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
gids = torch.zeros(4, dtype=torch.long)
adv, std = group_advantages(rewards, gids)
ids = torch.ones(4, 3, dtype=torch.long)
fresh = RolloutBatch.fresh(prompt_ids=ids, prompt_mask=torch.ones_like(ids), completion_ids=ids,
                           completion_mask=torch.ones_like(ids), behaviour_logps=torch.zeros(4, 3),
                           advantages=adv, rewards=rewards, group_ids=gids, group_std=std, step=0)
buf = ReplayBuffer(ReplayConfig.paper(warmup_steps=0), seed=0)
buf.add(fresh, step=0)
batch = compose_batch(fresh, buf, step=1).batch
loss, _ = ppo_clip_loss(torch.zeros(len(batch), 3), batch, LossConfig())
loaded = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
assert not loaded, loaded
print("ok", len(batch))
"""


def test_the_core_imports_and_runs_without_the_app_stack():
    """With yaml, transformers, datasets, matplotlib, math_verify, tqdm, ... made unimportable, the core still
    imports and runs a buffer round (torch's own optional `tqdm` import is guarded by torch itself)."""
    proc = subprocess.run([sys.executable, "-c", BLOCKER, ",".join(FORBIDDEN_LIBS)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ok", "6"]


def test_a_command_without_the_app_extra_names_the_extra():
    """`grpo-replay train` where the app stack is missing: exit 2 and the extra to install, not a traceback."""
    code = BLOCKER.split("import torch")[0] + "from grpo_replay.cli import main\nsys.exit(main(['train', '--steps', '1']))\n"
    proc = subprocess.run([sys.executable, "-c", code, "yaml,matplotlib"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "needs the 'app' extra" in proc.stderr and "missing: yaml, matplotlib" in proc.stderr
    assert "pip install 'grpo-replay[app]'" in proc.stderr and "Traceback" not in proc.stderr
