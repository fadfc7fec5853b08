"""`grpo-replay compare --report-to` and `grpo-replay plot` on real tiny runs, through the CLI."""
import csv
import json
import shutil

import pytest

from grpo_replay.cli import main
from helpers import read_jsonl


@pytest.fixture(scope="module")
def compare_runs(tmp_path_factory, tiny_overrides):
    """Two finished runs (grpo and paper, seed 0) of `compare --quick`, reported to TensorBoard."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install -e '.[track]')")
    out = tmp_path_factory.mktemp("compare-tb")
    argv = ["compare", "--quick", "--out", str(out), "--seeds", "1", "--comparisons", "composition", "--arms", "paper", "--jobs", "1",
            "--no-progress", "--cache-dir", tiny_overrides["testbed.cache_dir"]]
    assert main(argv + ["--report-to", "tensorboard"]) == 0
    dirs = sorted(p.parent for p in out.glob("runs/*/*/summary.json"))
    assert [d.parent.name for d in dirs] == ["grpo", "paper"]
    return out, dirs, argv


def test_compare_report_to_reaches_every_run(compare_runs, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, dirs, argv = compare_runs
    for d in dirs:
        ea = EventAccumulator(str(d / "tensorboard"), size_guidance={"scalars": 0})
        ea.Reload()
        rows = read_jsonl(d / "metrics.jsonl")
        assert [(e.step, pytest.approx(e.value, abs=1e-6)) for e in ea.Scalars("reward")] == [
            (r["step"], r["reward"]) for r in rows
        ]
    # report_to does not change what a run computes: same run directories without it (all finished)
    capsys.readouterr()
    assert main(argv + ["--dry-run"]) == 0
    planned = capsys.readouterr().out
    for d in dirs:
        assert f"done  {d.parent.name:<13} seed 0  {d}" in planned


def test_plot_runs_table_and_unfinished(compare_runs, tmp_path, capsys):
    _, dirs, _ = compare_runs
    # An unfinished run: a copy of the paper run cut after step 4 (as if killed), without summary.json.
    cut = tmp_path / "cut"
    shutil.copytree(dirs[1], cut, ignore=shutil.ignore_patterns("ckpt-*", "tensorboard"))
    (cut / "summary.json").unlink()
    rows = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("\n".join(rows[:4]) + '\n{"step": 5, "gen')  # last line cut mid-write
    evals = [e for e in read_jsonl(cut / "evals.jsonl") if e["step"] <= 4]
    (cut / "evals.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))

    png = tmp_path / "out" / "cmp.png"
    assert main(["plot", *map(str, dirs), str(cut), "--out", str(png)]) == 0
    cap = capsys.readouterr()
    assert f"{cut} is unfinished (step 4 of 6, no summary.json); plotted up to its last step" in cap.err
    assert png.stat().st_size > 10_000
    table = list(csv.DictReader(open(png.with_suffix(".csv"))))
    assert json.loads(png.with_suffix(".json").read_text())[0]["label"] == table[0]["label"]
    labels = [t["label"] for t in table]
    # the two paper runs share preset and seed: the distinguishing part of their paths is added
    assert labels[0] == "grpo seed 0"
    assert labels[1].startswith("paper seed 0 (") and labels[1].endswith(f"paper/{dirs[1].name})")
    assert labels[2].startswith("paper seed 0 (") and labels[2].endswith("cut) [unfinished: step 4/6]")
    assert table[2]["label"].endswith("[unfinished: step 4/6]") and table[2]["status"] == "unfinished"
    for t, d in zip(table, dirs):
        m, e = read_jsonl(d / "metrics.jsonl"), read_jsonl(d / "evals.jsonl")
        assert t["status"] == "finished" and t["steps"] == "6/6" and int(t["generated"]) == m[-1]["generated"]
        assert float(t["acc_sampled"]) == pytest.approx(e[-1]["acc_sampled"])
        assert float(t["acc_sampled_start"]) == pytest.approx(e[0]["acc_sampled"])
        assert float(t["replay_share_mean"]) == pytest.approx(sum(r["replay/share"] for r in m) / len(m))
    assert table[0]["replay_clip_frac_mean"] == ""  # grpo never replays
    assert float(table[2]["generated"]) == read_jsonl(dirs[1] / "metrics.jsonl")[3]["generated"]
    assert "grpo seed 0" in cap.out and "acc_sampled" in cap.out  # the printed table


def test_plot_bad_input(compare_runs, tmp_path, capsys):
    _, dirs, _ = compare_runs
    png = tmp_path / "p.png"
    assert main(["plot", str(dirs[0]), str(tmp_path), "--out", str(png)]) == 2
    assert f"{tmp_path} is not a grpo-replay run directory (no config.yaml" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing"), "--out", str(png)]) == 2
    assert "missing is not a directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(dirs[0] / "config.yaml", empty / "config.yaml")
    assert main(["plot", str(empty), "--out", str(png)]) == 2
    assert "has no logged steps yet" in capsys.readouterr().err
    assert main(["plot", str(dirs[0]), "--out", str(tmp_path / "p.pdf")]) == 2
    assert "must be a .png file" in capsys.readouterr().err
    assert not png.exists()


def _fake_run(d, preset="paper", seed=0, extra=""):
    """A finished-looking run directory: what plot reads (config.yaml, metrics.jsonl, evals.jsonl)."""
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(f"preset: {preset}\nseed: {seed}\nsteps: 1\nout_dir: {d}\n{extra}")
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "generated": 4, "reward": 0.5}) + "\n")
    (d / "evals.jsonl").write_text(json.dumps({"step": 1, "generated": 4, "acc_sampled": 0.5}) + "\n")
    (d / "summary.json").write_text("{}")
    return d


def test_plot_refuses_a_run_given_twice(tmp_path, monkeypatch, capsys):
    run = _fake_run(tmp_path / "r1")
    monkeypatch.chdir(tmp_path)
    png = tmp_path / "p.png"
    assert main(["plot", "r1", str(run), "--out", str(png)]) == 2  # one directory, written two ways
    assert f"r1 is given twice (as r1 and {run}); give each run once" in capsys.readouterr().err
    assert not png.exists()


def test_plot_labels_tell_a_run_and_a_run_inside_it_apart(tmp_path, capsys):
    outer = _fake_run(tmp_path / "a")
    inner = _fake_run(outer / "b")
    png = tmp_path / "p.png"
    assert main(["plot", str(outer), str(inner), "--out", str(png)]) == 0
    labels = [r["label"] for r in json.loads(png.with_suffix(".json").read_text())]
    assert labels == [f"paper seed 0 ({outer})", "paper seed 0 (b)"]


def test_plot_labels_runs_by_the_settings_that_differ_between_them(tmp_path, capsys):
    """Three runs of one preset and seed (dynamic sampling, three update epochs, neither) were all 'paper seed 0'."""
    plain = "dynamic_sampling: false\nupdate_epochs: 1\nreplay:\n  tau_max: 10\n"
    runs = [_fake_run(tmp_path / "x", extra=plain.replace("false", "true")),
            _fake_run(tmp_path / "y", extra=plain.replace("epochs: 1", "epochs: 3")),
            _fake_run(tmp_path / "z", extra=plain), _fake_run(tmp_path / "w", extra=plain.replace("10", "null")),
            _fake_run(tmp_path / "g", preset="grpo", extra=plain)]
    png = tmp_path / "p.png"
    assert main(["plot", *map(str, runs), "--out", str(png)]) == 0
    labels = [r["label"] for r in json.loads(png.with_suffix(".json").read_text())]
    assert labels == ["paper seed 0 (dynamic_sampling=true)", "paper seed 0 (update_epochs=3)", "paper seed 0",
                      "paper seed 0 (replay.tau_max=null)", "grpo seed 0"]
    # two runs differing in one key, neither the usual value: both named
    assert main(["plot", str(runs[0]), str(runs[2]), "--out", str(png)]) == 0
    labels = [r["label"] for r in json.loads(png.with_suffix(".json").read_text())]
    assert labels == ["paper seed 0 (dynamic_sampling=true)", "paper seed 0 (dynamic_sampling=false)"]
