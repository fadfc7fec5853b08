"""The Hydra `replay` group (config/replay/<preset>.yaml), generated from `ReplayConfig` and `VerlReplaySettings`.

After changing either (a field, a default, a docstring or a preset), rewrite the four files with

    .venv-verl/bin/python -m grpo_replay.integrations.verl.replay_group

tests/core/test_config.py (main environment, without verl) checks the core part of every file against `ReplayConfig`;
tests/integrations/verl_integration checks each whole file against `group_yaml`.
"""
from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import yaml

from ...config import PRESETS, ReplayConfig
from ...app.configio import field_docs
from .settings import VerlReplaySettings

GROUP_DIR = Path(__file__).parent / "config" / "replay"
SETTINGS_HEADER = "# --- verl integration settings (not part of the core ReplayConfig) ---"


def group_yaml(preset: str) -> str:
    """The text of config/replay/<preset>.yaml: the preset's core values, then the integration settings, each
    under its docstring as a comment."""
    summary = " ".join(getattr(ReplayConfig, preset).__doc__.split())
    lines = [
        f"# replay={preset}: {summary}",
        f"# Generated from grpo_replay.config.ReplayConfig.{preset}() by "
        "`python -m grpo_replay.integrations.verl.replay_group`; tests fail on drift.",
        "",
        "# Name of the core preset these values come from.",
        f"preset: {preset}",
        "",
    ]
    for header, values in ((None, ReplayConfig.from_preset(preset)), (SETTINGS_HEADER, VerlReplaySettings())):
        if header:
            lines += [header, ""]
        docs = field_docs(type(values))
        for f in dataclasses.fields(values):
            lines += ["# " + line for line in textwrap.wrap(docs[f.name], 114)]
            lines += [yaml.safe_dump({f.name: getattr(values, f.name)}).rstrip(), ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    for preset in PRESETS:
        path = GROUP_DIR / f"{preset}.yaml"
        path.write_text(group_yaml(preset))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
