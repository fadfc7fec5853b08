import os
import sys
from pathlib import Path

import pytest

# tests/ on sys.path so every test module can `import helpers` (never `from conftest import`: several exist).
sys.path.insert(0, str(Path(__file__).parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_overrides(tmp_path_factory):
    cache = tmp_path_factory.mktemp("testbed-cache")
    from helpers import TINY

    return {**TINY, "testbed.cache_dir": str(cache)}


