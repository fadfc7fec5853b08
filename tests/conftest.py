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


