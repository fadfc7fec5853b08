"""scripts/check_replay_share.py on verl's `file` logger output (what scripts/gpu_smoke.sh's verl path writes with
trainer.logger=["console","file"] and VERL_FILE_LOGGER_PATH): one JSON object a line, {"step": N, "data": {...}},
as verl 0.9.1's FileLogger writes it with orjson (compact), training and validation rows under the same step."""
from __future__ import annotations

import subprocess
import sys

import gpu_commands as gc

CHECK = gc.ROOT / "scripts/check_replay_share.py"


def _verl_log(path, shares):
    """A verl file-logger log: per training step the metrics our v1 trainer logs, a validation row at the last."""
    lines = []
    for i, s in enumerate(shares, start=1):
        count = 64 * s / (1 - s)
        lines.append(f'{{"step":{i},"data":{{"training/global_step":{i},"fresh/count":64.0,"replay/count":{count},'
                     f'"replay/share":{s},"replay/padding_rows":0.0,"actor/pg_loss":-0.0123,'
                     f'"perf/throughput":1234.5}}}}')
    lines.append(f'{{"step":{len(shares)},"data":{{"val-core/DigitalLearningGmbH/MATH-lighteval/acc/mean@1":0.25}}}}')
    path.write_text("\n".join(lines) + "\n")
    return path


def _check(path):
    return subprocess.run([sys.executable, str(CHECK), str(path), "--ratio", "0.5"], capture_output=True, text=True)


def test_verl_file_logger_log_is_read_and_judged(tmp_path):
    ok = _check(_verl_log(tmp_path / "ok.jsonl", [0.0, 1 / 3]))
    assert ok.returncode == 0 and "replay share per step: 0.000 0.333" in ok.stdout, ok
    none = _check(_verl_log(tmp_path / "none.jsonl", [0.0, 0.0]))  # a run that trained as GRPO
    assert none.returncode == 1 and "no replayed row in 2 steps" in none.stderr, none
    short = _check(_verl_log(tmp_path / "short.jsonl", [0.0, 0.2222]))  # a third short of the ratio
    assert short.returncode == 1 and "short of ratio/(1+ratio) = 0.3333" in short.stderr, short


def test_a_missing_or_empty_log_is_no_metrics(tmp_path):
    missing = _check(tmp_path / "absent.jsonl")
    assert missing.returncode == 2 and "neither a metrics file nor a folder" in missing.stderr, missing
    (tmp_path / "val_only.jsonl").write_text('{"step":1,"data":{"val-core/x/acc/mean@1":0.5}}\n')
    empty = _check(tmp_path / "val_only.jsonl")
    assert empty.returncode == 1 and "no step logged replay/share" in empty.stderr, empty
