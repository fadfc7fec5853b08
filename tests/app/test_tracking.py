"""report_to: TensorBoard event files and W&B offline runs carry the trainer's metrics, config and resumes."""
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_replay.app import tracking
from grpo_replay.cli import main
from grpo_replay.errors import ConfigError
from grpo_replay.trainer.train_config import resolve
from helpers import read_jsonl


def _argv(overrides: dict, out, *extra: str) -> list[str]:
    argv = ["train", "--out", str(out), "--no-progress", *extra]
    for k, v in overrides.items():
        if k != "progress":
            argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return argv


def _tb_scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    ea.Reload()
    return ea


def _wandb_records(path):
    """Records of a W&B transaction log (.wandb): a 7-byte header, then LevelDB-style chunks in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk of a record
            r = pb.Record()
            r.ParseFromString(buf)
            out.append(r)
            buf = b""
    return out


def test_tensorboard_and_wandb_get_every_metric_config_and_resume(tiny_overrides, tmp_path, monkeypatch, capsys):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install -e '.[track]')")
    pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install -e '.[track]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    (tmp_path / "wandb-dir").mkdir()
    out = tmp_path / "run"
    ov = {**tiny_overrides, "steps": 4, "checkpoint_every": 2, "eval_every": 2}
    argv = _argv(ov, out, "--report-to", "tensorboard", "wandb")
    assert main(argv) == 0
    run_id = (out / tracking.WANDB_ID_FILE).read_text().strip()
    assert f"W&B run {run_id} (offline, " in capsys.readouterr().out
    # Interrupt after the step-2 checkpoint: the resumed process redoes steps 3-4 and logs them again.
    shutil.rmtree(out / "ckpt-000004")
    (out / "summary.json").unlink()
    assert main(argv) == 0
    assert (out / tracking.WANDB_ID_FILE).read_text().strip() == run_id

    metrics, evals = read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "evals.jsonl")
    assert [r["step"] for r in metrics] == [1, 2, 3, 4] and [r["step"] for r in evals] == [0, 2, 4]

    # --- TensorBoard: one log dir, every scalar under its JSONL name, each step once (redone steps purged)
    ea = _tb_scalars(out / "tensorboard")
    tags = set(ea.Tags()["scalars"])
    for rows in (metrics, evals):
        for row in rows:
            for name, value in tracking.flat_scalars(row).items():
                if name == "step":
                    continue
                assert name in tags, name
                got = [e.value for e in ea.Scalars(name) if e.step == row["step"]]
                assert len(got) == 1 and got[0] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, row["step"], got)
    for name in ("reward", "replay/share", "fresh/clip_frac", "replay/clip_frac", "time/step_s", "acc_sampled", "pass@k/1"):
        assert name in tags, name
    assert [e.step for e in ea.Scalars("reward")] == [1, 2, 3, 4]
    hist = ea.Histograms("buffer/age_hist")
    assert [h.step for h in hist] == [1, 2, 3, 4]
    assert list(hist[-1].histogram_value.bucket) == [float(c) for c in metrics[-1]["buffer/age_hist"]]
    from tensorboard.plugins.hparams import plugin_data_pb2

    meta = ea.SummaryMetadata("_hparams_/session_start_info")
    hp = plugin_data_pb2.HParamsPluginData.FromString(meta.plugin_data.content).session_start_info.hparams
    assert hp["steps"].number_value == 4 and hp["preset"].string_value == "paper"
    assert hp["replay.tau_max"].number_value == 10 and hp["report_to"].string_value == "tensorboard,wandb"

    # --- W&B offline: both processes wrote to the same run id; config and history hold the metrics
    run_dirs = sorted((tmp_path / "wandb-dir" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(run_dirs) == 2, run_dirs
    history: dict[int, dict] = {}
    for d in run_dirs:
        recs = _wandb_records(d / f"run-{run_id}.wandb")
        run = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
        assert run and run[0].run_id == run_id
        config = {i.key: json.loads(i.value_json) for i in run[0].config.update}
        assert config["seed"] == 0 and config["steps"] == 4 and config["replay"]["tau_max"] == 10
        for r in recs:
            if r.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                history.setdefault(int(items["_step"]), {}).update(items)
    for row in metrics + evals:
        for name, value in tracking.flat_scalars(row).items():
            if name != "step":
                assert history[row["step"]][name] == pytest.approx(value, rel=1e-6, abs=1e-9), (name, row["step"])
    assert history[4]["buffer/age_hist/_type"] == "histogram"


def test_report_to_values_and_errors(monkeypatch):
    assert resolve({"report_to": "none"}).report_to == "none"
    assert resolve({"report_to": ["tensorboard", "wandb"]}).report_to == "tensorboard,wandb"
    assert resolve({"report_to": "wandb, tensorboard"}).report_to == "wandb,tensorboard"
    with pytest.raises(ConfigError, match=r"TrainConfig.report_to='mlflow' is invalid; allowed: none, tensorboard, wandb"):
        resolve({"report_to": "mlflow"})
    with pytest.raises(ConfigError, match="'none' cannot be combined"):
        resolve({"report_to": "none,wandb"})
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"'wandb' package is not installed; pip install -e '\.\[wandb\]' in a grpo-replay checkout"):
        resolve({"report_to": "wandb"})


def test_report_to_missing_package_fails_before_compute(tiny_overrides, tmp_path, monkeypatch, capsys):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    out = tmp_path / "run"
    assert main(_argv(tiny_overrides, out, "--report_to", "tensorboard")) == 2
    assert "pip install -e '.[tensorboard]' in a grpo-replay checkout" in capsys.readouterr().err
    assert not out.exists()


def test_flat_scalars_names():
    row = {"step": 3, "reward": 0.5, "loss": None, "skipped_nonfinite": False, "pass@k": {"1": 0.25},
           "counts": [1, 2], "buffer/age_hist": [3, 1], "bad": math.nan}
    assert tracking.flat_scalars(row) == {"step": 3.0, "reward": 0.5, "skipped_nonfinite": 0.0, "pass@k/1": 0.25}


def test_backend_trl_hands_report_to_to_trl(tiny_overrides, tmp_path, monkeypatch):
    """--backend trl: report_to goes to TRL's own option (a full TRL run is covered in tests/trainer)."""
    pytest.importorskip("trl")
    import grpo_replay.integrations.trl as trl_integration

    seen = {}

    def stop(**kw):  # the ReplayGRPOConfig the run would train with
        seen.update(kw)
        raise KeyboardInterrupt  # not caught by the CLI: ends the run here

    monkeypatch.setattr(trl_integration, "ReplayGRPOConfig", stop)
    ov = {**tiny_overrides, "backend": "trl", "steps": 2}
    with pytest.raises(KeyboardInterrupt):
        main(_argv(ov, tmp_path / "trl", "--report-to", "tensorboard", "wandb"))
    assert seen["report_to"] == ["tensorboard", "wandb"]


def test_wandb_without_login_is_a_clear_error(tmp_path):
    pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install -e '.[track]')")
    # A fresh process, as a user's would be: W&B keeps process-wide settings (and an earlier test's offline mode)
    # that teardown() does not always clear, which made this check depend on the test order.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), WANDB_DIR=str(tmp_path), PYTHONPATH=str(Path(tracking.__file__).parents[2]))
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from grpo_replay.app import tracking\n"
        "from grpo_replay.errors import ConfigError\n"
        "try:\n"
        "    tracking.Tracker('wandb', Path(sys.argv[1]), {'seed': 0})\n"
        "except ConfigError as e:\n"
        "    print('CONFIG ERROR:', e)\n"
        "    sys.exit(0)\n"
        "sys.exit('no ConfigError')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert re.search(r"CONFIG ERROR: report_to=wandb: .*API key.*set WANDB_MODE=offline", proc.stdout), proc.stdout


def test_a_tracker_added_on_resume_is_refused_as_compare_refuses_it(tiny_overrides, tmp_path, capsys):
    """A tracker the run was not made with would hold only the steps after the checkpoint (no step-0 evaluation):
    refused before any compute, naming report_to (compare refuses the same); dropping one is allowed."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install -e '.[track]')")
    out = tmp_path / "run"
    ov = {**tiny_overrides, "checkpoint_every": 1}
    assert main(_argv({**ov, "steps": 1}, out)) == 0
    capsys.readouterr()
    assert main(_argv({**ov, "steps": 2}, out, "--report-to", "tensorboard")) == 2
    err = capsys.readouterr().err
    assert "TrainConfig.report_to='tensorboard' adds tensorboard to the run" in err and "made with report_to='none'" in err
    assert not (out / "tensorboard").exists() and [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1]
    other = tmp_path / "tb"
    assert main(_argv({**ov, "steps": 1}, other, "--report-to", "tensorboard")) == 0
    assert main(_argv({**ov, "steps": 2}, other)) == 0  # a tracker dropped: the rows go on in the files
    assert [r["step"] for r in read_jsonl(other / "metrics.jsonl")] == [1, 2]
