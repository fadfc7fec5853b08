"""Clean terminal output of a real run: only grpo-replay's bar, each warning once and on its own line."""
import json
import warnings

import transformers.utils.logging as tlog

from grpo_replay.cli import main
from grpo_replay.trainer import loop


def test_one_progress_bar_and_warnings_once(tiny_overrides, tmp_path, monkeypatch, capfd):
    real = loop.split_tally

    def split_tally_with_warnings(*a, **kw):  # a warning of each kind at every step
        warnings.warn("synthetic step warning", UserWarning)
        tlog.get_logger("transformers.generation.utils").warning("synthetic logged warning")
        return real(*a, **kw)

    monkeypatch.setattr(loop, "split_tally", split_tally_with_warnings)
    argv = ["train", "--out", str(tmp_path / "run")]  # progress bar on; checkpoints every 2 steps write shards
    for k, v in {**tiny_overrides, "steps": 4}.items():
        if k != "progress":
            argv += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    assert main(argv) == 0
    err = capfd.readouterr().err
    assert "grpo-replay: 100%" in err  # our bar
    assert "Writing model shards" not in err and "Loading weights" not in err  # transformers' bars
    assert err.count("UserWarning: synthetic step warning") == 1 and err.count("synthetic logged warning") == 1
    # printed above the bar (tqdm.write clears the bar's line first), never glued to the bar's text
    segments = [s for line in err.split("\n") for s in line.split("\r")]
    assert any(s.startswith(__file__) and "UserWarning: synthetic step warning" in s for s in segments)
    assert any(s.startswith("transformers.generation.utils: WARNING: synthetic logged warning") for s in segments)
    # everything is restored after the run
    assert tlog.is_progress_bar_enabled()
    assert warnings.showwarning.__name__ != "show_once"
