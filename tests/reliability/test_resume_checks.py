"""Resuming the right run with the right config: `--config RUN/config.yaml` resumes RUN wherever it was made or
moved; a run without its config.yaml is checked against the config its checkpoint carries; a damaged newest
checkpoint falls back to the previous complete one, naming the damaged file; a full disk is reported as one."""
import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import read_jsonl, without_times

from grpo_replay.cli import main
from grpo_replay.trainer import checkpoint


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _copy(reference_run, dest: Path) -> Path:
    shutil.copytree(reference_run, dest)
    return dest


# --- item: --config RUN/config.yaml resumes RUN ---------------------------------------------------------------
def test_config_of_a_run_made_with_a_relative_out_resumes_it_from_another_directory(reference_run, tmp_path, monkeypatch, capsys):
    run = _copy(reference_run, tmp_path / "project" / "runs" / "x")
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["out_dir"] = "runs/x"  # as written by `grpo-replay train --out runs/x` run from tmp/project
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    metrics = (run / "metrics.jsonl").read_bytes()
    config = os.path.relpath(run / "config.yaml", elsewhere)
    assert main(["train", "--config", config, "--no-progress"]) == 0
    assert f"{Path(config).parent} has already done its 6 steps; nothing to train" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []  # no new run started here
    assert (run / "metrics.jsonl").read_bytes() == metrics


def test_config_of_a_moved_run_resumes_the_moved_run_not_the_old_place(reference_run, tmp_path, capsys):
    moved = _copy(reference_run, tmp_path / "moved{1}")  # braces: out_dir is a format template
    old = _snapshot(reference_run)
    assert main(["train", "--config", str(moved / "config.yaml"), "--steps", "8", "--no-progress"]) == 0
    assert f"resuming {moved} from ckpt-000006 (step 6 of 8)" in capsys.readouterr().out
    assert [r["step"] for r in read_jsonl(moved / "metrics.jsonl")] == list(range(1, 9))
    assert _snapshot(reference_run) == old  # the run at the old place is untouched
    assert yaml.safe_load((moved / "config.yaml").read_text())["steps"] == 8


# --- item: a run without config.yaml is checked against its checkpoint's config --------------------------------
def test_a_run_without_config_yaml_refuses_another_config_using_its_checkpoints(reference_run, train_args, tmp_path, capsys):
    run = _copy(reference_run, tmp_path / "run")
    (run / "config.yaml").unlink()
    before = _snapshot(run)
    assert main(train_args(run, group_size=8, lr=0.1)) == 2
    err = capsys.readouterr().err
    assert "holds a run made with a different config" in err and "group_size: 4 (run) -> 8 (requested)" in err
    assert "lr: 0.003 (run) -> 0.1 (requested)" in err
    assert _snapshot(run) == before
    # checkpoints made before they carried their config: nothing to check against, so refused too
    for ck in checkpoint.list_checkpoints(run):
        (ck / checkpoint.CONFIG).unlink()
    before = _snapshot(run)
    assert main(train_args(run)) == 2
    assert "holds a run's results but no config.yaml" in capsys.readouterr().err
    assert _snapshot(run) == before


def test_a_checkpoint_carries_the_config_it_was_made_with(reference_run):
    for ck in checkpoint.list_checkpoints(reference_run):
        assert (ck / checkpoint.CONFIG).read_text() == (reference_run / "config.yaml").read_text()


# --- item: a damaged newest checkpoint --------------------------------------------------------------------------
def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 3)])


@pytest.mark.parametrize("name, damage", [
    ("model/model.safetensors", _truncate),
    ("optim.pt", _truncate),
    ("torch_rng.pt", _truncate),
    ("trainer_state.json", lambda p: p.write_text('{"step": 6, "gener')),
])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(reference_run, train_args, tmp_path, capsys, name, damage):
    run = _copy(reference_run, tmp_path / "run")
    (run / "summary.json").unlink()
    damage(run / "ckpt-000006" / name)
    assert main(train_args(run)) == 0
    err = capsys.readouterr().err
    assert f"warning: ckpt-000006/{name} is damaged (" in err
    assert "resuming from ckpt-000004, the newest complete checkpoint" in err
    # steps 5 and 6 redone from ckpt-000004: the same run as the uninterrupted one
    assert without_times(read_jsonl(run / "metrics.jsonl")) == without_times(read_jsonl(reference_run / "metrics.jsonl"))
    assert read_jsonl(run / "evals.jsonl") == read_jsonl(reference_run / "evals.jsonl")


def test_every_checkpoint_damaged_is_exit_2_naming_the_files(reference_run, train_args, tmp_path, capsys):
    run = _copy(reference_run, tmp_path / "run")
    for ck in checkpoint.list_checkpoints(run):
        _truncate(ck / "optim.pt")
    assert main(train_args(run)) == 2
    err = capsys.readouterr().err
    assert "every checkpoint in" in err and "ckpt-000006/optim.pt is damaged" in err and "ckpt-000004/optim.pt is damaged" in err
    assert "Traceback" not in err


# --- item: a full disk -------------------------------------------------------------------------------------------
def _tmpfs(path: Path, size: str):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("a real full disk needs a small tmpfs, which needs mount rights here")


@pytest.mark.parametrize("file", ["model.safetensors", "optim.pt"])
def test_a_real_full_disk_at_a_checkpoint_is_reported_as_one(tmp_path, file):
    """safetensors and torch's own writer report ENOSPC as their own errors (SafetensorError, a RuntimeError
    "unexpected pos"); the trainer's message for a full disk needs the OSError."""
    from test_checkpoint import _parts

    from grpo_replay.trainer.rundir import RunDir
    from grpo_replay.trainer.stopping import CheckpointError

    parts = _parts()
    model, opt, sched, buf, rng = parts
    probe = tmp_path / "probe"
    probe.mkdir()
    sizes = {p.name: p.stat().st_size for p in checkpoint.save(probe, 1, *parts[:1], None, *parts[1:],
                                                               {"initial_eval": None}).rglob("*") if p.is_file()}
    disk = tmp_path / "disk"
    _tmpfs(disk, "1m")
    try:
        # leave room for a part of the file that should fail (the model is written first, then optim.pt)
        room = sizes["model.safetensors"] // 2 if file == "model.safetensors" else sizes["model.safetensors"] + 4096
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "filler").write_bytes(b"\0" * (free - room))
        with pytest.raises(CheckpointError, match="checkpoint at step 1 failed: No space left on device; there is no "
                                                  "previous checkpoint") as e:
            RunDir(disk).save_checkpoint(1, {"initial_eval": None}, 2, model=model, tokenizer=None, optimizer=opt,
                                         scheduler=sched, buffer=buf, prompt_rng=rng)
        assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.ENOSPC
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # the partial checkpoint is removed
    finally:
        subprocess.run(["umount", str(disk)])


def test_a_full_disk_while_plots_are_written_leaves_no_truncated_png(reference_run, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from grpo_replay.plotting.training import plot_run

    run = _copy(reference_run, tmp_path / "run")
    before = (run / "accuracy.png").read_bytes()

    def full_disk(self, fname, **kw):
        with open(fname, "wb") as f:
            f.write(b"\x89PNG\r\n")  # a first block made it to disk, then the disk filled
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    with pytest.raises(OSError):
        plot_run(run)
    assert (run / "accuracy.png").read_bytes() == before  # the old plot, whole
    assert not list(run.glob("*.tmp"))


def test_a_full_disk_while_the_final_plots_are_written_stops_with_a_message(reference_run, train_args, tmp_path, monkeypatch,
                                                                           capsys):
    from grpo_replay.plotting import training as plots

    run = _copy(reference_run, tmp_path / "run")

    def full_disk(run_dir):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(plots, "plot_run", full_disk)
    assert main(train_args(run)) == 1  # exit 1: rerun (with space) to write them
    err = capsys.readouterr().err
    assert f"stopped: writing the plots into {run} failed: No space left on device; the run is complete" in err
    assert "Traceback" not in err
    monkeypatch.undo()
    assert main(train_args(run)) == 0 and (run / "accuracy.png").stat().st_size > 0


_FSIZE_SCRIPT = r"""
import resource, signal, sys
sys.path.insert(0, sys.argv[2])
from test_checkpoint import _parts, _train_a_bit
from grpo_replay.trainer.rundir import RunDir
from grpo_replay.trainer.stopping import CheckpointError

model, opt, sched, buf, rng = _parts()
_train_a_bit(model, opt, sched, buf, 0)  # the optimizer's state (two moments) makes optim.pt twice the weights
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG instead of a signal
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), int(sys.argv[3])))
try:
    RunDir(sys.argv[1]).save_checkpoint(1, {"initial_eval": None}, 2, model=model, tokenizer=None, optimizer=opt,
                                        scheduler=sched, buffer=buf, prompt_rng=rng)
except CheckpointError as e:
    print("CheckpointError", type(e.__cause__).__name__, getattr(e.__cause__, "errno", None), e)
"""


def test_torch_writer_failing_mid_file_is_an_os_error_the_trainer_explains(tmp_path):
    """Without mount rights: a file-size limit makes optim.pt's write fail part-way, as a full disk does; torch's own
    writer reported that as a RuntimeError ("unexpected pos"), which no handler explained."""
    import errno as errnos
    import sys

    from test_checkpoint import _parts, _train_a_bit

    from grpo_replay.trainer import checkpoint as ck

    parts = _parts()
    _train_a_bit(*parts[:4], 0)
    probe = ck.save(tmp_path / "probe", 1, parts[0], None, *parts[1:], {"initial_eval": None})
    limit = (probe / "model" / "model.safetensors").stat().st_size + 64  # the weights fit, optim.pt does not
    assert (probe / "optim.pt").stat().st_size > limit
    tests = str(Path(__file__).resolve().parent)
    r = subprocess.run([sys.executable, "-c", _FSIZE_SCRIPT, str(tmp_path / "run"), tests, str(limit)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [str(Path(tests).parents[1] / "src"), str(Path(tests).parent), os.environ.get("PYTHONPATH", "")])})
    assert f"CheckpointError OSError {errnos.EFBIG} checkpoint at step 1 failed: File too large" in r.stdout, r.stdout + r.stderr
    assert not list((tmp_path / "run").glob("ckpt-*"))
