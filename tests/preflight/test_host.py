"""The host facts the preflight reads: nvidia-smi's driver, GPU count and memory; the driver a CUDA build needs."""
import os
import sys

from grpo_replay.preflight.host import GPU_STACKS, Host, MIN_DRIVER, check_stack, parse_driver
from grpo_replay.preflight.report import Report


def test_nvidia_smi_is_read_for_driver_gpus_and_the_smallest_memory(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '575.57.08, 81559\\n575.57.08, 40960\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    host = Host.detect()
    assert (host.gpus, host.gpu_memory, host.driver) == (2, 40960 * 2**20, "575.57.08")


def test_without_nvidia_smi_the_report_says_what_a_gpu_host_needs(monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    host = Host.detect()
    assert host.gpus == 0 and host.driver is None
    report = Report("x")
    check_stack(Host(0, 0, None, "2.13.0+cpu", None, None), "main", True, 8, report)
    text = "\n".join(report.sections["software"])
    assert "torch 2.13.0 (CUDA 13.0 build" in text and "a GPU host needs driver >= 580" in text and "8 GPU(s)" in text
    assert not report.refusals


def test_cuda_13_builds_need_driver_580():
    assert GPU_STACKS["main"].needs_driver() == GPU_STACKS["verl"].needs_driver() == (580, 0) == MIN_DRIVER[13]
    assert parse_driver("575.57.08") < (580, 0) <= parse_driver("580.65.06")
    report = Report("x")
    check_stack(Host(8, 81559 * 2**20, "580.65.06", "2.13.0+cu130", "13.0", "0.31.0"), "main", True, 8, report)
    assert not report.refusals
    check_stack(Host(4, 81559 * 2**20, "580.65.06", "2.13.0+cu130", "13.0", "0.31.0"), "main", True, 8, report)
    assert [r.field for r in report.refusals] == ["GPUs"]


def test_an_old_cuda_12_driver_is_refused_with_the_cuda_12_route_for_torch_and_vllm():
    report = Report("x")
    check_stack(Host(8, 81559 * 2**20, "570.86.15", "2.13.0+cu130", "13.0", "0.31.0"), "main", True, 8, report)
    (refusal,) = report.refusals
    assert refusal.field == "NVIDIA driver"
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu129" in refusal.fix
    assert ("releases/download/v0.31.0/vllm-0.31.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl --extra-index-url "
            "https://download.pytorch.org/whl/cu129") in refusal.fix
    too_old = Report("x")  # below CUDA 12's minimum the CUDA 12.9 builds do not run either
    check_stack(Host(8, 81559 * 2**20, "470.57.02", "2.13.0+cu130", "13.0", "0.31.0"), "main", True, 8, too_old)
    assert "cu129" not in too_old.refusals[0].fix
