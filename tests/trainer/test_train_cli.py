"""Real training runs through the CLI on the tiny testbed."""
import json

import pytest

from grpo_replay.cli import main
from helpers import read_jsonl, without_times


def _args(overrides: dict, out, **extra) -> list[str]:
    sets = {**overrides, **extra}
    argv = ["train", "--out", str(out), "--no-progress"]
    for k, v in sets.items():
        if k == "progress":
            continue
        argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return argv


def test_paper_preset_run_dir_and_replay(tiny_overrides, tmp_path, capsys):
    out = tmp_path / "paper"
    assert main(_args(tiny_overrides, out)) == 0
    for f in ["config.yaml", "metrics.jsonl", "evals.jsonl", "summary.json", "accuracy.png", "buffer_age.png",
              "replay_share.png", "clip_fraction.png"]:
        assert (out / f).is_file(), f
    assert (out / "ckpt-000006" / "model" / "model.safetensors").is_file()
    assert (out / "ckpt-000006" / "buffer.npz").is_file()
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 7))
    warm = tiny_overrides["replay.warmup_steps"]
    assert all(r["replay/count"] == 0 for r in rows[:warm])  # warm-up: no replay
    after = [r for r in rows[warm:] if r["fresh/count"] > 0]
    assert after and all(r["replay/count"] == round(0.5 * r["fresh/count"]) for r in after)
    assert all(r["replay/age_max"] <= 10 for r in rows if r["replay/count"])
    # Without replayed rows there is no replay ratio, clip fraction or age to report (not a 1.0 / 0 placeholder).
    assert not any(k in r for r in rows[:warm] for k in ("replay/ratio_mean", "replay/clip_frac", "replay/age_mean"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["generated_rollouts"] == 6 * 8 * 4
    assert "warm start" in capsys.readouterr().out


def test_grpo_preset_never_replays(tiny_overrides, tmp_path):
    out = tmp_path / "grpo"
    assert main(_args(tiny_overrides, out, preset="grpo")) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert all(r["replay/count"] == 0 and r["replay/share"] == 0 for r in rows)


@pytest.mark.parametrize("preset", ["uniform_pool", "sigma_pool"])
def test_pool_presets_keep_batch_size(tiny_overrides, tmp_path, preset):
    out = tmp_path / preset
    assert main(_args(tiny_overrides, out, preset=preset, steps=4)) == 0
    rows = read_jsonl(out / "metrics.jsonl")
    for r in rows:
        assert r["update_rows"] == r["fresh/count"] + r["replay/count"]
    assert any(r["replay/count"] > 0 for r in rows[2:])
    # pool: the update never exceeds the fresh rows that survived the filter
    assert all(r["update_rows"] <= 32 for r in rows)


def test_same_seed_same_metrics(tiny_overrides, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(_args(tiny_overrides, a, steps=4)) == 0
    assert main(_args(tiny_overrides, b, steps=4)) == 0
    ra, rb = without_times(read_jsonl(a / "metrics.jsonl")), without_times(read_jsonl(b / "metrics.jsonl"))
    assert ra == rb
    assert read_jsonl(a / "evals.jsonl") == read_jsonl(b / "evals.jsonl")


def test_invalid_config_fails_before_compute(tiny_overrides, tmp_path, capsys):
    out = tmp_path / "bad"
    assert main(_args(tiny_overrides, out, **{"replay.tau_maxx": 3})) == 2
    assert "did you mean 'replay.tau_max'" in capsys.readouterr().err
    assert main(_args(tiny_overrides, out, **{"replay.priority": "td"})) == 2
    assert "allowed: abs_advantage, group_std, uniform" in capsys.readouterr().err
    assert not out.exists()  # nothing was computed or written


def test_backend_trl_runs_testbed(tiny_overrides, tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "trl"
    assert main(_args(tiny_overrides, out, backend="trl", steps=3, **{"replay.warmup_steps": 1})) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["backend"] == "trl" and s["generated_rollouts"] == 3 * 8 * 4
    assert (out / "final" / "model.safetensors").is_file()
    hist = json.loads((out / "trl_summary.json").read_text())["replay_history"]
    assert len(hist) == 3 and hist[0]["replay_rows"] == 0  # warm-up step
