"""The core's boundary: `import grpo_replay` needs only torch and numpy, and no core module imports a layer above it.

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
                              "integrations"}


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
