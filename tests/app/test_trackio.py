"""report_to=trackio: the trainer's and compare's rows, config and resumes, read back from trackio's SQLite store."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import grpo_replay
from grpo_replay.app import tracking
from helpers import read_jsonl

# The whole CLI in a fresh process: trackio reads TRACKIO_DIR once, when it is first imported.
_CLI = "import sys\nfrom grpo_replay.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _cli(argv, tmp_path, **env_extra):
    src = str(Path(grpo_replay.__file__).parents[1])  # the checkout's src/, wherever tracking lives in it
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HOME": str(tmp_path / "hf"), **env_extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-c", _CLI, *argv], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _store(tmp_path, project="grpo-replay"):
    """{run name: {step: merged metrics}}, {run name: config} of the project's SQLite database."""
    db = tmp_path / "trackio" / f"{project}.db"
    assert db.is_file(), sorted(p.name for p in (tmp_path / "trackio").iterdir())
    con = sqlite3.connect(db)
    runs: dict[str, dict[int, dict]] = {}
    seen: dict[tuple[str, int, str], int] = {}
    for name, step, metrics in con.execute("SELECT run_name, step, metrics FROM metrics ORDER BY id"):
        for k, v in json.loads(metrics).items():
            seen[(name, step, k)] = seen.get((name, step, k), 0) + 1
            runs.setdefault(name, {}).setdefault(step, {})[k] = v
    configs = {name: json.loads(c) for name, c in con.execute("SELECT run_name, config FROM configs")}
    con.close()
    twice = [key for key, n in seen.items() if n > 1]
    assert not twice, f"logged more than once: {twice[:5]}"
    return runs, configs


def _same_rows(history: dict, run_dir: Path) -> None:
    """Every scalar of metrics.jsonl and evals.jsonl at its step. Timings only by name: a redone step keeps the
    first process's values in trackio, and only its timings differ (the rest is recomputed exactly)."""
    metrics, evals = read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(run_dir / "evals.jsonl")
    assert sorted(history) == sorted({r["step"] for r in metrics + evals})
    for row in metrics + evals:
        for name, value in tracking.flat_scalars(row).items():
            if name.startswith("time/"):
                assert name in history[row["step"]], (name, row["step"])
            elif name != "step":
                assert history[row["step"]][name] == pytest.approx(value, rel=1e-6, abs=1e-9), (name, row["step"])
    last = metrics[-1]
    hist = history[last["step"]]["buffer/age_hist"]
    assert hist["_type"] == "trackio.histogram" and hist["values"] == last["buffer/age_hist"]


def _argv(overrides, out, *extra):
    argv = ["train", "--out", str(out), "--no-progress", *extra]
    for k, v in overrides.items():
        if k != "progress":
            argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return argv


def test_trackio_gets_every_metric_config_and_resume(tiny_overrides, tmp_path):
    pytest.importorskip("trackio", reason="the trackio extra is not installed (pip install -e '.[trackio]')")
    out = tmp_path / "run"
    ov = {**tiny_overrides, "steps": 4, "checkpoint_every": 2, "eval_every": 2}
    argv = _argv(ov, out, "--report-to", "trackio")
    printed = _cli(argv, tmp_path)
    name = (out / tracking.TRACKIO_NAME_FILE).read_text().strip()
    assert name.startswith("run-") and f"trackio run {name} in project grpo-replay" in printed
    # Interrupt after the step-2 checkpoint: the resumed process redoes steps 3-4; each step is stored once.
    shutil.rmtree(out / "ckpt-000004")
    (out / "summary.json").unlink()
    _cli(argv, tmp_path)
    assert (out / tracking.TRACKIO_NAME_FILE).read_text().strip() == name

    runs, configs = _store(tmp_path)
    assert list(runs) == [name]
    _same_rows(runs[name], out)
    config = configs[name]
    assert config["steps"] == 4 and config["seed"] == 0 and config["replay"]["tau_max"] == 10
    assert config["report_to"] == "trackio"


def test_compare_reports_every_run_to_trackio(tiny_overrides, tmp_path):
    pytest.importorskip("trackio", reason="the trackio extra is not installed (pip install -e '.[trackio]')")
    out = tmp_path / "cmp"
    _cli(["compare", "--quick", "--out", str(out), "--seeds", "1", "--comparisons", "composition", "--arms", "paper", "--jobs", "1",
          "--no-progress", "--cache-dir", tiny_overrides["testbed.cache_dir"], "--report-to", "trackio"],
         tmp_path, TRACKIO_PROJECT="cmp-test")
    dirs = sorted(p.parent for p in out.glob("runs/*/*/summary.json"))
    assert [d.parent.name for d in dirs] == ["grpo", "paper"]
    runs, _ = _store(tmp_path, project="cmp-test")
    names = [(d / tracking.TRACKIO_NAME_FILE).read_text().strip() for d in dirs]
    assert sorted(runs) == sorted(names) and len(set(names)) == 2
    for d, name in zip(dirs, names):
        _same_rows(runs[name], d)


def test_report_to_accepts_trackio_or_names_its_extra(monkeypatch):
    from grpo_replay.errors import ConfigError
    from grpo_replay.trainer.train_config import resolve

    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name, *a: object() if name == "trackio" else real(name, *a))
    assert resolve({"report_to": "tensorboard,trackio"}).report_to == "tensorboard,trackio"
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a))
    with pytest.raises(ConfigError, match=r"'trackio' package is not installed; pip install -e '\.\[trackio\]'"):
        resolve({"report_to": "trackio"})
    with pytest.raises(ConfigError, match=r"allowed: none, tensorboard, wandb, trackio"):
        resolve({"report_to": "mlflow"})
