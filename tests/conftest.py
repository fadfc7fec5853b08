import os
import sys
from pathlib import Path

import pytest

# tests/ on sys.path so every test module can `import helpers` (never `from conftest import`: several exist).
sys.path.insert(0, str(Path(__file__).parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The benchmark and training data live beside the checkout in this workspace; the code finds data only through
# arguments or $GRPO_REPLAY_DATA, so the tests (and every command they start) set it here.
_SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
if _SHARED_DATA.is_dir():
    os.environ.setdefault("GRPO_REPLAY_DATA", str(_SHARED_DATA))

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # n workers share the cores: each worker, and every command it starts (inherited through the environment),
    # gets cores // n torch/OpenMP threads. With torch's default of one thread per core, two workers' spinning
    # OpenMP threads oversubscribed two cores: SmolLM2 generating 48 tokens took 133 s on two threads against
    # 17 s on one, on the loaded 2-core VM (a throwaway timing script).
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _threads)
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def tiny_overrides(tmp_path_factory):
    cache = tmp_path_factory.mktemp("testbed-cache")
    from helpers import TINY

    return {**TINY, "testbed.cache_dir": str(cache)}




def _run_folders_state() -> dict[str, int]:
    """Every file under the checkout's own run folders (the main job's runs/, verl's checkpoints/) with its mtime."""
    root = Path(__file__).resolve().parents[1]
    return {str(p): p.stat().st_mtime_ns for d in ("runs", "checkpoints") for p in (root / d).rglob("*")
            if p.is_file()}


@pytest.fixture(scope="session", autouse=True)
def checkout_run_folders_untouched():
    """No test writes into the checkout's run folders: the README's main job may have filled them before the tests
    (CI runs the two in that order), and a test that resolved a launch against them would depend on it."""
    before = _run_folders_state()
    yield
    after = _run_folders_state()
    changed = sorted(set(before.items()) ^ set(after.items()))
    assert not changed, f"tests changed the checkout's run folders: {[p for p, _ in changed][:5]}"
