"""Build a wheelhouse for a GPU host without internet whose Python already has a stack (torch, transformers,
accelerate): this project's wheel, TRL, datasets, math-verify and what they need beyond that stack, as wheels for
the target's Python and platform (not this machine's), so `pip install --no-index --find-links` installs it there.

Run on a machine with internet (PyPI); the target needs none:

    python scripts/build_wheelhouse.py WHEELHOUSE [--python-version 3.12] [--stack "torch==2.11.0 ..."] [--vllm]
    pip install --no-index --find-links WHEELHOUSE -r WHEELHOUSE/requirements.txt      # on the target

How: pip resolves `grpo-replay[app,trl]` (with --vllm also `[vllm]`) for the target (--python-version, --platform,
binary wheels only, so nothing is built here for the wrong interpreter) beside the stack's pins, in a dry run whose
report lists every package. torch is stood in by a metadata-only wheel of the stack's version, so its CUDA
libraries are never resolved or fetched. Left out: the stack's packages and the binary packages the stack itself
depends on (numpy, tokenizers, safetensors, ...: a pip-installed stack has them). Shipped: everything else,
pure-Python dependencies of the stack included (pip installs one only where the target's copy is missing or too
old). Writes WHEELHOUSE/requirements.txt (what to install) and WHEELHOUSE/manifest.json (files, sizes, what was left
to the stack); prints the size. Exit 2: bad arguments; 1: pip failed (its output is shown).
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]
    from pip._vendor.packaging.version import Version  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_STACK = "torch==2.11.0 transformers==5.17.0 accelerate==1.13.0"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
STUB_LABEL = "+stack"  # local version label of the stand-in torch wheel


def stub_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel with metadata only (no code, no dependencies): the resolver takes it for the installed `name`."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: build_wheelhouse\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = {p: base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b"=").decode()
              for p, c in files.items()}
    files[f"{dist}/RECORD"] = "".join(f"{p},sha256={digest[p]},{len(c)}\n" for p, c in list(files.items())) + \
        f"{dist}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, c in files.items():
            z.writestr(p, c)
    return path


def pip(args: list[str], what: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"build_wheelhouse: {what} failed (pip exit {proc.returncode}; its output is above)")


def target_args(python_version: str, platforms: list[str]) -> list[str]:
    abi = "cp" + python_version.replace(".", "")
    out = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp", "--abi", abi]
    for p in platforms:
        out += ["--platform", p]
    return out


def stack_closure(report: dict, roots: set[str]) -> set[str]:
    """Names the stack's packages need, transitively, as resolved in `report` (markers read for the target)."""
    env = report["environment"]
    by_name = {canonicalize_name(i["metadata"]["name"]): i for i in report["install"]}
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        for spec in by_name[name]["metadata"].get("requires_dist", []):
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def is_pure(item: dict) -> bool:
    return item["download_info"]["url"].rsplit("/", 1)[-1].endswith("-none-any.whl")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the wheelhouse folder (made; must be new or empty)")
    p.add_argument("--python-version", default="3.12", help="the target's Python, major.minor (default 3.12)")
    p.add_argument("--platform", action="append", default=None,
                   help=f"a wheel platform tag of the target, repeatable (default: {' '.join(PLATFORMS)})")
    p.add_argument("--stack", default=DEFAULT_STACK,
                   help=f"the target's preinstalled packages as pins, space-separated (default: '{DEFAULT_STACK}'); "
                        "torch must be one of them")
    p.add_argument("--vllm", action="store_true", help="add the vllm extra (several hundred MB; needs the stack's torch "
                   "to be one a vLLM release in the extra's range pins)")
    a = p.parse_args(argv)
    try:
        stack = [Requirement(s) for s in a.stack.split()]
    except ValueError as e:  # packaging's InvalidRequirement
        p.error(f"--stack '{a.stack}': {e}; it takes pins such as torch==2.11.0, space-separated")
    pins = {canonicalize_name(r.name): r for r in stack}
    torch_pin = pins.get("torch")
    if torch_pin is None or not str(torch_pin.specifier).startswith("=="):
        p.error(f"--stack must pin torch exactly (torch==X.Y.Z), got '{a.stack}'")
    if len(a.python_version.split(".")) != 2:
        p.error(f"--python-version takes major.minor (3.12), got '{a.python_version}'")
    if a.out.exists() and any(a.out.iterdir()):
        p.error(f"{a.out} is not empty; pass a new folder")
    a.out.mkdir(parents=True, exist_ok=True)
    platforms = a.platform or list(PLATFORMS)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pip(["wheel", "--no-deps", "-q", "-w", str(a.out), str(ROOT)], "building the project's wheel")
        (wheel,) = a.out.glob("grpo_replay-*.whl")
        # A local label of the stack's torch (2.13.0+cpu) gives way to the stand-in's own.
        stub_version = Version(str(torch_pin.specifier)[2:]).public + STUB_LABEL
        stub_wheel(tmp, "torch", stub_version)
        extras = "app,trl,vllm" if a.vllm else "app,trl"
        wanted = f"grpo-replay[{extras}] @ {wheel.resolve().as_uri()}"
        others = [str(r) for n, r in pins.items() if n != "torch"]
        report_file = tmp / "report.json"
        pip(["install", "--dry-run", "--ignore-installed", "-q", "--report", str(report_file), "--target",
             str(tmp / "target"), "--find-links", str(tmp), *target_args(a.python_version, platforms), wanted,
             f"torch=={stub_version}", *others],
            "resolving for the target")
        report = json.loads(report_file.read_text())
        closure = stack_closure(report, set(pins))
        ship, left = [], []
        for item in report["install"]:
            name = canonicalize_name(item["metadata"]["name"])
            if name == "grpo-replay":
                continue
            if name in pins or (name in closure and not is_pure(item)):
                left.append(f"{item['metadata']['name']}=={item['metadata']['version']}")
            else:
                ship.append(f"{item['metadata']['name']}=={item['metadata']['version']}")
        pins_file = tmp / "ship.txt"
        pins_file.write_text("\n".join(ship) + "\n")
        pip(["download", "--no-deps", "-q", "-d", str(a.out), *target_args(a.python_version, platforms),
             "-r", str(pins_file)], "downloading the wheels")

    (a.out / "requirements.txt").write_text(f"grpo-replay[{extras}]=={wheel.name.split('-')[1]}\n")
    files = sorted(f for f in a.out.glob("*.whl"))
    sizes = {f.name: f.stat().st_size for f in files}
    total = sum(sizes.values())
    (a.out / "manifest.json").write_text(json.dumps({
        "python_version": a.python_version, "platforms": platforms, "stack": a.stack, "vllm": a.vllm,
        "left_to_the_stack": sorted(left), "files": sizes, "total_bytes": total}, indent=1) + "\n")
    print(f"build_wheelhouse: {len(files)} wheels, {total / 2**20:.1f} MiB in {a.out} (Python {a.python_version}; "
          f"left to the stack: {', '.join(sorted(left))})")
    print(f"install on the target: pip install --no-index --find-links {a.out} -r {a.out}/requirements.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
