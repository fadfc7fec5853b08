import json
from pathlib import Path

import pytest

from grpo_replay.app.data import BENCHMARKS
from helpers import SHARED_DATA, build_tiny_model

SHARED_BENCH = SHARED_DATA / "benchmarks"
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def bench_dir(tmp_path_factory) -> Path:
    """The first 3 problems of each shared benchmark (or synthetic ones when the shared data is absent)."""
    out = tmp_path_factory.mktemp("bench")
    for name in BENCHMARKS:
        src = SHARED_BENCH / f"{name}.jsonl"
        if src.is_file():
            lines = src.read_text(encoding="utf-8").splitlines()[:3]
        else:
            lines = [json.dumps({"id": f"{name}-{i}", "problem": f"What is {i}+1?", "answer": str(i + 1),
                                 "source": "synthetic"}) for i in range(3)]
        (out / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out
