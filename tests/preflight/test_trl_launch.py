"""The preflight of a TRL script reads the script, never runs it; a launch it cannot read is refused with exit 2
naming what to change; the launch's world size reaches TRL's own checks."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("trl")

from grpo_replay.cli import main  # noqa: E402
from grpo_replay.preflight.host import Host  # noqa: E402
from grpo_replay.preflight.trl_script import read_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SYNC_YAML = str(ROOT / "examples/trl/qwen3_0.6b_math_replay.yaml")
CPU = Host(gpus=0, gpu_memory=0, driver=None, torch="2.13.0+cpu", torch_cuda=None, vllm=None)

# A script with side effects at import and no main guard; its parser would read the preflight's own command line.
UNGUARDED = '''
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from trl import ModelConfig, TrlParser
from grpo_replay.integrations.trl import ReplayGRPOConfig
import nonexistent_reward_package

Path("SIDE_EFFECT").write_text("the script ran")

@dataclass
class Data:
    dataset_name: str = field(default="my/data", metadata={"help": "dataset"})
    dataset_split: str = "train"
    limit: Optional[int] = None

data, args, model = TrlParser((Data, ReplayGRPOConfig, ModelConfig)).parse_args_and_config()
raise SystemExit("training started")
'''


@pytest.fixture(autouse=True)
def cpu_host(monkeypatch, tmp_path):
    import accelerate.commands.config.config_args as config_args
    import accelerate.commands.launch as launch

    monkeypatch.setattr(launch, "default_config_file", str(tmp_path / "none.yaml"))
    monkeypatch.setattr(config_args, "default_config_file", str(tmp_path / "none.yaml"))
    monkeypatch.setattr(Host, "detect", classmethod(lambda cls: CPU))
    monkeypatch.chdir(tmp_path)


def test_the_script_is_read_not_run(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    spec = read_script(script)
    assert [c.__name__ for c in spec.classes] == ["Data", "ReplayGRPOConfig", "ModelConfig"]
    assert spec.imports["nonexistent_reward_package"] is False  # a required import
    env = dict(os.environ)
    config = tmp_path / "cfg.yaml"  # the recipe without its dataset_name: the script's default applies
    config.write_text("".join(line for line in Path(SYNC_YAML).read_text().splitlines(True)
                              if not line.startswith("dataset_name:")))
    code = main(["preflight", "accelerate", "launch", "--num_processes", "8", str(script), "--config", str(config),
                 "--output_dir", "out", "--dataset_split", "test"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert not (tmp_path / "SIDE_EFFECT").exists()
    assert "my/data (split test)" in out  # the script's own dataclass, its default and the override
    assert "the GPU host needs: the script imports `nonexistent_reward_package`" in out
    assert dict(os.environ) == env


def test_the_script_beside_it_is_read_too(tmp_path, capsys):
    """The async example imports its dataclass and reward from the sync example beside it: read, not imported."""
    spec = read_script(ROOT / "examples/trl/train_qwen3_math_async_replay.py")
    assert [c.__name__ for c in spec.classes] == ["AsyncScriptArguments", "ReplayAsyncGRPOConfig"]
    assert "math_verify" in spec.imports and "train_qwen3_math_replay" not in spec.imports


@pytest.mark.parametrize("launch, field_name", [
    (["python", "nope.py", "--config", SYNC_YAML], "nope.py"),
    (["accelerate", "launch", "nope.py", "--config", SYNC_YAML], "nope.py"),
    (["accelerate", "launch", "--config_file", "nope.yaml", "SCRIPT", "--config", SYNC_YAML], "--config_file"),
    (["accelerate", "launch", "SCRIPT", "--config", "nope.yaml"], "--config"),
    (["accelerate", "launch", "SCRIPT", "--config", SYNC_YAML, "--no_such_flag", "1"], "--no_such_flag"),
    (["accelerate", "launch", "--num_processes", "x", "SCRIPT"], "--num_processes"),
    (["accelerate", "launch", "PLAIN", "--config", SYNC_YAML], "PLAIN"),
    (["accelerate", "launch", "SCRIPT"], "--config"),
])
def test_a_launch_it_cannot_read_exits_2_naming_the_field(tmp_path, capsys, launch, field_name):
    script, plain = tmp_path / "train.py", tmp_path / "plain.py"
    script.write_text(UNGUARDED)
    plain.write_text("import sys\nprint(sys.argv)\n")  # no TrlParser
    launch = [str(script) if a == "SCRIPT" else str(plain) if a == "PLAIN" else a for a in launch]
    field_name = str(plain) if field_name == "PLAIN" else field_name
    assert main(["preflight", *launch]) == 2
    captured = capsys.readouterr()
    assert f"refused: {field_name}: " in captured.err, captured
    assert "Traceback" not in captured.err and not (tmp_path / "SIDE_EFFECT").exists()
