"""compare's worker pools: a run on a GPU or with vLLM gets a process of its own (a vLLM engine does not give its
GPU memory and process groups back within a process); CPU runs share workers."""
import os
import sys

import pytest

from grpo_replay.experiments import jobs
from grpo_replay.experiments.final_eval import BenchSettings


def _pids(fresh: bool, tasks: int = 3) -> list[int]:
    with jobs.worker_pool(1, fresh) as pool:
        return [pool.submit(os.getpid).result() for _ in range(tasks)]


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info < (3, 11), reason="max_tasks_per_child needs Python 3.11")
def test_fresh_pool_runs_each_task_in_a_new_process():
    assert len(set(_pids(fresh=True))) == 3
    assert len(set(_pids(fresh=False))) == 1


def test_gpu_and_vllm_runs_get_their_own_process(tiny_overrides):
    assert not jobs.uses_gpu({**tiny_overrides, "device": "cpu"})
    assert jobs.uses_gpu({**tiny_overrides, "device": "cuda"})
    assert jobs.uses_gpu({**tiny_overrides, "device": "cpu", "generator": "vllm"})


def test_execute_and_evaluate_all_ask_for_fresh_workers_on_a_gpu(monkeypatch, tiny_overrides, tmp_path):
    """Both stages build their pool through worker_pool with fresh=True when a run needs a GPU."""
    from grpo_replay.experiments import final_eval

    asked = []

    def fake_pool(n, fresh):
        asked.append(fresh)
        raise RuntimeError("stop here")

    monkeypatch.setattr(jobs, "worker_pool", fake_pool)
    monkeypatch.setattr(final_eval, "worker_pool", fake_pool)
    spec = jobs.RunSpec("grpo", 0, {**tiny_overrides, "device": "cuda"}, tmp_path / "r", 1)
    with pytest.raises(RuntimeError, match="stop here"):
        jobs.execute([spec], jobs=1, progress=False)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "summary.json").write_text("{}")
    with pytest.raises(RuntimeError, match="stop here"):
        final_eval.evaluate_all([spec], BenchSettings(backend="vllm", benchmarks=("math500",)), jobs=1, log=lambda m: None)
    assert asked == [True, True]
