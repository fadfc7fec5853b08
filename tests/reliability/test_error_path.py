"""One error path: every command raises, and only `grpo_replay.cli.main` turns what it raised into an exit code and
one line on stderr (`grpo_replay.errors.exit_code` / `headline`). Bad input exits 2, a stop exits 1, a bug keeps
its traceback."""
import subprocess
import sys

import pytest

from grpo_replay import errors
from grpo_replay.cli import main

# One bad input per command, each refused before any compute: (argv, the line stderr must hold).
BAD_INPUT = {
    "train": (["train", "--set", "lr=abc", "--out", "t"],
              "grpo-replay train: config error: lr='abc' has the wrong type; expected float"),
    "eval": (["eval", "--model", "no-such-model", "--seed", "-5", "--out", "e"],
             "grpo-replay eval: error: --seed -5 is invalid; allowed: an integer in 0..2147483647"),
    "compare": (["compare", "--quick", "--comparisons", "nope", "--out", "c"],
                "grpo-replay compare: error: unknown comparison(s) ['nope']; allowed: "),
    "plot": (["plot", "r", "--out", "p.pdf"], "grpo-replay plot: error: --out p.pdf must be a .png file"),
    "preflight": (["preflight", "nonsense"],
                  "grpo-replay preflight: error: 'nonsense' is not a launch it knows; allowed: grpo-replay train"),
}


def test_every_command_is_listed():
    from grpo_replay.cli import COMMANDS

    assert set(BAD_INPUT) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(BAD_INPUT))
def test_bad_input_of_every_command_exits_2_through_the_real_entry_point(command, tmp_path):
    """`python -m grpo_replay.cli` (what the `grpo-replay` script runs), in a fresh process: exit 2, the one line
    the mapping prints, no traceback, nothing written."""
    argv, line = BAD_INPUT[command]
    proc = subprocess.run([sys.executable, "-m", "grpo_replay.cli", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert line in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [l for l in proc.stderr.splitlines() if l.startswith("grpo-replay ")] == [l for l in proc.stderr.splitlines()
                                                                                  if line in l]
    assert list(tmp_path.iterdir()) == []


def _command_raising(monkeypatch, exc):
    import grpo_replay.cli.plot as plot

    def run(args):
        raise exc

    monkeypatch.setattr(plot, "run", run)


@pytest.mark.parametrize("exc, code, line", [
    (errors.Stopped("stopped after step 3; rerun the same command to resume"), 1,
     "grpo-replay plot: stopped: stopped after step 3; rerun the same command to resume"),
    (errors.ConfigError("TrainConfig.lr=-1 is invalid; allowed: a number > 0"), 2,
     "grpo-replay plot: config error: TrainConfig.lr=-1 is invalid; allowed: a number > 0"),
    (errors.InputNotFound("data file d.jsonl does not exist"), 2, "grpo-replay plot: error: data file d.jsonl does not exist"),
    (errors.MissingDependency("needs vLLM"), 2, "grpo-replay plot: error: needs vLLM"),
])
def test_main_maps_the_exception_tree_once(monkeypatch, capsys, exc, code, line):
    _command_raising(monkeypatch, exc)
    assert main(["plot", "r"]) == code
    assert capsys.readouterr().err.strip() == line


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Not one of ours (a plain ValueError, KeyError, FileNotFoundError): main re-raises it unmapped."""
    for exc in (KeyError("x"), ValueError("a library's own message"), FileNotFoundError("mid-run")):
        _command_raising(monkeypatch, exc)
        with pytest.raises(type(exc)):
            main(["plot", "r"])
        assert errors.exit_code(exc) is None
