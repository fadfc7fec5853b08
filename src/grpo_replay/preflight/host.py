"""The software stack a launch will get and whether the host's NVIDIA driver runs it.

On a GPU host the facts are the installed ones (torch and its CUDA build, vLLM) and nvidia-smi's (driver, GPUs,
memory). On a CPU host the launch is planned for another machine: the report says what the GPU install line gives
(`GPU_STACKS`, the versions pip resolves for the install lines in README.md / scripts/setup_verl_gpu.sh) and which
driver that build needs. A CUDA build needs a driver at least as new as `MIN_DRIVER` says (NVIDIA's CUDA
compatibility table, Linux; minor-version compatibility within a major release): torch and vLLM built for CUDA 13
see no GPU at all on a 535-575 driver, `torch.cuda.is_available()` is False and the first error points elsewhere.
On such a driver (CUDA 12.x) the route is the CUDA 12.9 builds of both (`cuda12_route`, docs/trl.md#cuda-12-drivers).
"""
from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

# CUDA major version -> the oldest Linux driver that runs its builds (major, minor).
MIN_DRIVER = {13: (580, 0), 12: (525, 60), 11: (450, 80)}


@dataclass(frozen=True)
class Stack:
    torch: str
    cuda: str  # the CUDA version the torch wheel is built for
    vllm: Optional[str]
    install: str  # where the environment comes from

    def needs_driver(self) -> tuple[int, int]:
        return MIN_DRIVER[int(self.cuda.split(".")[0])]


# What a GPU install line resolves to from the public index: vLLM 0.31 pins torch 2.13.0 and verl 0.9.1's extras
# torch 2.11.0; PyPI's wheels of both are the CUDA 13.0 builds.
GPU_STACKS = {
    "main": Stack("2.13.0", "13.0", "0.31.0", "pip install -e '.[app,trl,vllm,tensorboard]' (README.md)"),
    "verl": Stack("2.11.0", "13.0", "the one verl[vllm]==0.9.1 pins", "bash scripts/setup_verl_gpu.sh"),
}


# PyTorch's CUDA 12.9 index and vLLM's own CUDA 12.9 release wheels (vLLM's install guide: the PyPI wheel is the
# CUDA 13 build; the +cu129 build is a release asset, installed with PyTorch's matching index).
TORCH_CU129 = "https://download.pytorch.org/whl/cu129"
VLLM_CU129 = ("https://github.com/vllm-project/vllm/releases/download/v{v}/vllm-{v}+cu129-cp38-abi3-"
              "manylinux_2_28_x86_64.whl")


def cuda12_route(st: Stack) -> str:
    """The install line that gives `st`'s torch and vLLM as CUDA 12.9 builds (a driver >= 525.60 runs them)."""
    vllm = st.vllm if st.vllm and st.vllm[0].isdigit() else "VERSION"
    return (f"pip install torch=={st.torch.split('+')[0]} --index-url {TORCH_CU129}, then vLLM's CUDA 12.9 build: "
            f"pip install {VLLM_CU129.format(v=vllm.split('+')[0])} --extra-index-url {TORCH_CU129}"
            + ("" if vllm != "VERSION" else " (VERSION: the vLLM the environment pins)")
            + " (docs/trl.md#cuda-12-drivers)")


@dataclass(frozen=True)
class Host:
    """This machine (or the one named on the command line): its GPUs and the installed stack."""

    gpus: int
    gpu_memory: int  # bytes per GPU (the smallest); 0 without GPUs
    driver: Optional[str]
    torch: str
    torch_cuda: Optional[str]  # None: a CPU build of torch
    vllm: Optional[str]

    @classmethod
    def detect(cls) -> "Host":
        import torch

        gpus, memory, driver = _nvidia_smi()
        return cls(gpus=gpus, gpu_memory=memory, driver=driver, torch=torch.__version__,
                   torch_cuda=torch.version.cuda, vllm=_version("vllm"))

    def stack(self, env: str) -> Stack:
        """The stack the launch runs on: the installed one where torch is a CUDA build, else the GPU install's."""
        if self.torch_cuda:
            return Stack(self.torch, self.torch_cuda, self.vllm, "installed here")
        return GPU_STACKS[env]


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvidia_smi() -> tuple[int, int, Optional[str]]:
    """(GPUs, bytes of the smallest one, driver version) from nvidia-smi; (0, 0, None) without it."""
    if shutil.which("nvidia-smi") is None:
        return 0, 0, None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0, 0, None
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    if not rows:
        return 0, 0, None
    return len(rows), min(int(float(r[1])) for r in rows) * 2**20, rows[0][0]


def parse_driver(text: str) -> tuple[int, int]:
    parts = (text.split(".") + ["0"])[:2]
    return int(parts[0]), int(parts[1])


def check_stack(host: Host, env: str, needs_gpu: bool, gpus_needed: int, report) -> None:
    """The versions the launch will get and whether they fit the host, into `report` (refusals included)."""
    st = host.stack(env)
    need = st.needs_driver()
    need_text = f"{need[0]}.{need[1]:02d}" if need[1] else str(need[0])
    report.add("software", f"torch {st.torch} (CUDA {st.cuda} build; {st.install}), vLLM {st.vllm or 'not installed'}")
    if host.torch_cuda is None:
        report.add("software", f"this host's torch is {host.torch} (a CPU build): the launch is planned for a GPU host")
    if host.driver is None:
        report.add("software", f"no NVIDIA driver here; a GPU host needs driver >= {need_text} for CUDA {st.cuda} "
                               f"builds (nvidia-smi's 'Driver Version'), and {gpus_needed} GPU(s)")
        return
    report.add("software", f"NVIDIA driver {host.driver}, {host.gpus} GPU(s) of {host.gpu_memory / 2**30:.1f} GiB")
    if parse_driver(host.driver) < need:
        report.refuse("NVIDIA driver", f"driver {host.driver} is older than the {need_text} CUDA {st.cuda} builds of "
                      f"torch {st.torch} need: torch.cuda.is_available() would be False",
                      f"install NVIDIA driver >= {need_text}"
                      + (f", or on a CUDA 12 driver (>= 525.60: 550, 570) the CUDA 12.9 builds of torch and vLLM: "
                         f"{cuda12_route(st)}" if int(st.cuda.split(".")[0]) >= 13
                         and parse_driver(host.driver) >= MIN_DRIVER[12] else ""))
    if needs_gpu and host.gpus < gpus_needed:
        report.refuse("GPUs", f"the launch uses {gpus_needed} GPU(s), this host has {host.gpus}",
                      "a host with enough GPUs, or fewer processes / GPUs per node in the launch")
