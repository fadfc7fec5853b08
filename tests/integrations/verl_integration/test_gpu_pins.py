"""The GPU install (scripts/setup_verl_gpu.sh and the steps docs/verl.md lists) pins what verl 0.9.1's own
`verl[vllm,fsdp]` declares: read from the installed verl's metadata, its nested extras followed, so a pin that
drifts from verl's (a torch or flash-attn verl does not declare) fails here before a GPU node finds out."""
from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytest.importorskip("verl.protocol")

ROOT = Path(__file__).resolve().parents[3]
PIN = re.compile(r'"([A-Za-z0-9_.\-]+)==([0-9][A-Za-z0-9.]*)"')


def verl_pins(extras: set[str]) -> dict[str, str]:
    """{distribution: version} of every `==` requirement verl declares under `extras`, nested extras followed."""
    pins: dict[str, str] = {}
    todo, seen = set(extras), set()
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for r in map(Requirement, md.requires("verl") or []):
            if r.marker is None or not r.marker.evaluate({"extra": extra}):
                continue
            if r.name == "verl":
                todo |= set(r.extras) - seen
                continue
            exact = [s.version for s in r.specifier if s.operator == "=="]
            if exact:
                pins[r.name.lower()] = exact[0]
    return pins


def gpu_block_pins(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(where, distribution, version) of every quoted `name==version` of the setup script and docs/verl.md's
    `gpu` blocks, verl itself left out."""
    out = []
    script = (root / "scripts/setup_verl_gpu.sh").read_text()
    doc = (root / "docs/verl.md").read_text()
    blocks = re.findall(r"```bash gpu\n(.*?)```", doc, flags=re.S)
    for where, text in [("scripts/setup_verl_gpu.sh", script)] + [("docs/verl.md", b) for b in blocks]:
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            for name, version in PIN.findall(line):
                base = name.split("[")[0].lower()
                if base != "verl":
                    out.append((where, base, version))
    return out


def differences(root: Path = ROOT) -> list[tuple[str, str, str, str]]:
    """(where, name, our pin, verl's) for every GPU-install pin that is not verl[vllm,fsdp]==0.9.1's."""
    declared = verl_pins({"vllm", "fsdp"})
    return [(w, d, v, declared[d]) for w, d, v in gpu_block_pins(root) if d in declared and declared[d] != v]


def test_gpu_install_pins_are_verl_0_9_1s_own():
    assert md.version("verl") == "0.9.1"
    assert {"torch", "flash-attn", "vllm", "transformers"} <= set(verl_pins({"vllm", "fsdp"}))
    assert {d for _, d, _ in gpu_block_pins()} >= {"torch", "flash-attn"}
    assert not differences(), "pins that differ from verl[vllm,fsdp]==0.9.1's (where, name, ours, verl's)"


def test_a_pin_verl_does_not_declare_is_caught(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "docs").mkdir()
    script = (ROOT / "scripts/setup_verl_gpu.sh").read_text()
    (tmp_path / "scripts/setup_verl_gpu.sh").write_text(script.replace('"flash-attn==2.8.3"', '"flash-attn==2.7.4"'))
    (tmp_path / "docs/verl.md").write_text((ROOT / "docs/verl.md").read_text())
    assert differences(tmp_path) == [("scripts/setup_verl_gpu.sh", "flash-attn", "2.7.4", "2.8.3")]
