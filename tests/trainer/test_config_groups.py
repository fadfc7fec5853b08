"""`TrainConfig`'s fields grouped under `# Parameters ...` headings (as TRL's GRPOConfig groups its own), shown by
`grpo-replay train --list-keys`; the grouping is layout only (hashes are of sorted keys, resume checks compare keys)."""
import dataclasses

import yaml

from grpo_replay.app import configio
from grpo_replay.cli import main
from grpo_replay.trainer.rundir import config_diff
from grpo_replay.trainer.train_config import FIELDS, TrainConfig, resolve


def test_every_field_is_under_a_heading():
    groups = configio.field_groups(TrainConfig)
    assert set(groups) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert all(h.startswith("Parameters ") for h in groups.values()), [k for k, h in groups.items() if not h]


def test_list_keys_prints_every_key_once_under_its_heading(capsys):
    assert main(["train", "--list-keys"]) == 0
    headings, keys = [], []
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("# "):
            headings.append(line[2:])
        elif line:
            key, doc = line.split(": ", 1)
            assert doc == FIELDS[key][1]
            keys.append(key)
    assert keys == list(FIELDS)
    assert headings == list(dict.fromkeys(configio.field_groups(TrainConfig).values()))  # each group shown once


def test_a_config_yaml_with_its_keys_in_another_order_reads_back_the_same_config(tmp_path):
    """Runs saved before the regrouping wrote config.yaml in the older field order; a resume reads keys, not lines."""
    cfg = resolve({"preset": "grpo", "replay.tau_max": 3})
    saved = configio.plain(cfg.to_dict())
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(dict(reversed(list(saved.items()))), sort_keys=False))
    assert path.read_text() != cfg.to_yaml()
    assert resolve(yaml_path=str(path)) == cfg
    assert config_diff(resolve(yaml_path=str(path)), cfg) == {}
