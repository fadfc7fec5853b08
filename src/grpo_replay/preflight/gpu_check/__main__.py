"""python -m grpo_replay.preflight.gpu_check [--out DIR] [--device cuda|cpu] [--tiny] [--only NAMES] [--sizes ...]

Exit 0: every check passed or was skipped (the report says why); 3: a check failed (the report says which and
why); 2: refused before any check (no CUDA device for --device cuda, an unknown check or size, a folder in use).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import time
from pathlib import Path

CHECKS = ("testbed", "memory", "scoring", "trl", "vllm")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def parse(argv):
    from .paper_step import SIZES

    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(f"runs/gpu-check-{time.strftime('%Y%m%d-%H%M%S')}"))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="toy shapes everywhere (the CPU dry run)")
    p.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated, among {', '.join(CHECKS)}")
    p.add_argument("--sizes", default=",".join(SIZES), help=f"model shapes for memory and scoring, among "
                   f"{', '.join(SIZES)} (ignored with --tiny)")
    p.add_argument("--testbed-timeout", type=float, default=300.0, help="seconds the main job may take (300)")
    p.add_argument("--budget", type=float, default=450.0,
                   help="seconds after which the checks not yet started are skipped, saying so (450)")
    a = p.parse_args(argv)
    a.only = [x for x in a.only.split(",") if x]
    a.sizes = ["tiny"] if a.tiny else [x for x in a.sizes.split(",") if x]
    bad = [x for x in a.only if x not in CHECKS]
    if bad:
        p.error(f"--only {','.join(bad)}: unknown; allowed: {', '.join(CHECKS)}")
    bad = [x for x in a.sizes if x not in SIZES and x != "tiny"]
    if bad:
        p.error(f"--sizes {','.join(bad)}: unknown; allowed: {', '.join(SIZES)}")
    if a.out.exists() and any(a.out.iterdir()):
        p.error(f"--out {a.out}: not empty; pass a new folder")
    return a


def header(device) -> dict:
    import torch

    h = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "device": str(device), "torch": torch.__version__,
         "cuda": torch.version.cuda, "python": platform.python_version(), "host": platform.node(),
         "offline": ", ".join(f"{k}={os.environ.get(k)}" for k in OFFLINE),
         "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "(unset: every GPU)")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        h.update(device_name=props.name, device_memory_GiB=round(props.total_memory / 2**30, 1))
    else:
        h["device_name"] = "CPU (dry run: no peak memory measured)"
    for name in ("transformers", "accelerate", "trl", "datasets", "vllm"):
        h[name] = _version(name)
    return h


def _version(name: str) -> str:
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


def vllm_result():
    from .report import skipped

    title = "vLLM (the recipes' generator)"
    if importlib.util.find_spec("vllm") is None:
        return skipped("vllm", title, "vLLM is not installed: the recipes' generation (generator=vllm, TRL's "
                       "use_vllm) cannot run here; the checks above generate with transformers")
    return skipped("vllm", title, f"vLLM {_version('vllm')} is installed but not started by this check (it would "
                   "take most of the card); scripts/gpu_smoke.sh's builtin and trl paths run it")


def main(argv=None) -> int:
    os.environ.update(OFFLINE)  # before transformers or datasets are imported: nothing is downloaded
    # One GPU, before CUDA starts: transformers' Trainer spreads an unlaunched run over every visible GPU.
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
    a = parse(argv)
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda, but torch sees no CUDA device (torch "
              f"{torch.__version__}, CUDA {torch.version.cuda}); on a CPU machine the dry run is --device cpu --tiny",
              file=sys.stderr)
        return 2
    device = torch.device(a.device)
    a.out.mkdir(parents=True, exist_ok=True)
    from . import paper_step, testbed_job, trl_replay
    from .report import run_check, skipped, write

    steps = {
        "testbed": ("the main job (grpo-replay train, the embedded testbed)",
                    lambda r: testbed_job.check(r, a.out / "testbed", a.device, a.tiny,
                                                min(a.testbed_timeout, max(a.budget, 1.0)))),
        "memory": ("one training step at the paper recipe's per-GPU shapes, peak memory per phase vs the preflight",
                   lambda r: paper_step.check_memory(r, device, a.sizes, a.tiny)),
        "scoring": ("chunked log-prob scoring's peak vs its estimate",
                    lambda r: paper_step.check_scoring(r, device, a.sizes, a.tiny)),
        "trl": ("ReplayGRPOTrainer, 2 steps, tiny random Qwen3, transformers generation, replay rows in the loss",
                lambda r: trl_replay.check(r, a.out / "trl", device)),
    }
    head, results, t0 = header(device), [], time.monotonic()
    for name in CHECKS:
        if name not in a.only:
            continue
        spent = time.monotonic() - t0
        if name == "vllm":
            res = vllm_result()
        elif spent > a.budget:
            res = skipped(name, steps[name][0], f"the time budget (--budget {a.budget:.0f} s) was spent after "
                          f"{spent:.0f} s; run it alone with --only {name}")
        else:
            res = run_check(name, steps[name][0], steps[name][1], a.out)
        results.append(res)
        print(f"gpu_check {name:8s} {res.status:7s} {res.seconds:7.1f}s  {res.why}", flush=True)
        write(a.out, head, results)  # a report after every check: an interrupted check leaves the earlier ones
    js, md_path = write(a.out, head, results)
    print(f"gpu_check: reports {js} and {md_path}")
    return 3 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
