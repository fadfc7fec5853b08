"""Every verl launch the docs, examples/verl and scripts/gpu_smoke.sh give composes against verl 0.9.1 on CPU: the
launch script's final overrides (collected by tests/gpu_commands.py, the scripts themselves run) compose with Hydra
into `replay_ppo_trainer` with no unknown key, the entry point picks the runner `trainer.use_v1` names, and verl's
own `validate_config` accepts the result. The GPU install pins are the ones verl 0.9.1 declares."""
from __future__ import annotations

import importlib.metadata as md
import re

import pytest

pytest.importorskip("verl.protocol")
pytest.importorskip("ray")

import gpu_commands as gc  # noqa: E402

ENTRY = "grpo_replay.integrations.verl.main"
SCRIPTS = ("examples/verl/run_paper_single_node.sh", "examples/verl/run_paper_multi_node.sh")
VARIANTS = ({}, {"MODE": "colocate_async"}, {"MODE": "separate_async", "ROLLOUT_GPUS": "4"}, {"TRAINER": "legacy"})
PRESETS = ("paper", "grpo", "uniform_pool", "sigma_pool")


def _launches(records) -> list[tuple[str, list[str]]]:
    return [(r["source"], args) for r in records if r["cmd"] == "python"
            and (args := gc.strip_python_m(r["argv"], ENTRY)) is not None]


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verl")
    out = _launches(gc.doc_commands(tmp / "docs"))
    smoke = gc.smoke_commands(tmp / "smoke")
    out += _launches(gc.run_with_env(smoke["verl"], tmp / "smoke-verl", "scripts/gpu_smoke.sh verl"))
    for script in SCRIPTS:
        for i, env in enumerate(VARIANTS):
            for preset in PRESETS:
                argv = ["env", *(f"{k}={v}" for k, v in {**env, "PRESET": preset}.items()), "bash", script]
                out += _launches(gc.run_with_env(argv, tmp / f"{script.split('/')[-1]}-{i}-{preset}", f"{script} {env} {preset}"))
    return out


def test_every_launch_is_collected(launches):
    sources = {s.split(":")[0].split(" ")[0] for s, _ in launches}
    assert {"README.md", "docs/paper_table.md", "docs/verl.md", "scripts/gpu_smoke.sh", *SCRIPTS} <= sources, sources
    assert len(launches) >= 6 + 1 + len(SCRIPTS) * len(VARIANTS) * len(PRESETS)


def test_every_launch_composes_and_picks_its_runner(launches):
    from hydra import compose, initialize_config_module
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from grpo_replay.integrations.verl.main import check_config
    from grpo_replay.integrations.verl.legacy.runner import ReplayTaskRunner
    from grpo_replay.integrations.verl.runner_v1 import ReplayTaskRunnerV1

    seen = set()
    for source, overrides in launches:
        with initialize_config_module(config_module="grpo_replay.integrations.verl.config", version_base=None):
            cfg = compose(config_name="replay_ppo_trainer", overrides=overrides)  # an unknown key raises here
        runner = check_config(cfg)
        assert runner is (ReplayTaskRunnerV1 if cfg.trainer.use_v1 else ReplayTaskRunner), source
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        seen.add((bool(cfg.trainer.use_v1), cfg.trainer.v1.trainer_mode if cfg.trainer.use_v1 else None, cfg.replay.preset))
    assert {(True, "sync", "paper"), (True, "colocate_async", "paper"), (True, "separate_async", "paper"),
            (False, None, "paper"), (True, "sync", "grpo")} <= seen


def test_gpu_install_pins_are_verls():
    """scripts/setup_verl_gpu.sh (and docs/verl.md's copy of it) install the torch, torchvision, torchaudio and
    flash-attn versions verl 0.9.1's vllm and fsdp extras pin."""
    from packaging.requirements import Requirement

    assert md.version("verl") == "0.9.1"
    pins = {}
    for r in map(Requirement, md.requires("verl")):
        if r.marker and any(r.marker.evaluate({"extra": e}) for e in ("vllm", "fsdp", "flash-attn-cu130torch211")):
            if r.name in ("torch", "torchvision", "torchaudio", "flash-attn"):
                pins[r.name] = str(r.specifier)
    assert set(pins) == {"torch", "torchvision", "torchaudio", "flash-attn"}, pins
    for path in ("scripts/setup_verl_gpu.sh", "docs/verl.md"):
        text = (gc.ROOT / path).read_text()
        for name, spec in pins.items():
            assert re.search(rf'"{re.escape(name)}{re.escape(spec)}"', text), f"{path}: {name}{spec}"
        assert '--no-build-isolation "flash-attn' in text and '"verl[vllm,fsdp]==0.9.1"' in text, path
