"""A corpus of `grpo-replay train` / `compare` launches through `grpo-replay preflight` on a faked CPU host: plausible
bad launches, each refused with exit 2 naming the key the user typed, with a fix that the test applies and that
then passes; valid ones that pass, the run directory said as `train` and `compare` would treat it (new, resumes
from the checkpoint its resume would load, finished, continues a shorter finished run)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grpo_replay.cli.preflight import resolve
from grpo_replay.errors import exit_code
from grpo_replay.preflight.host import Host

CPU_HOST = Host(gpus=0, gpu_memory=0, driver=None, torch="2.13.0+cpu", torch_cuda=None, vllm=None)
MATH = str(Path(__file__).resolve().parents[2].parent / "shared" / "data" / "train" / "math_train.jsonl")


def _sets(overrides: dict) -> list[str]:
    out = []
    for k, v in overrides.items():
        if k != "progress":
            out += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny testbed's --set flags (its warm start cached for this module) and a finished 6-step run of them
    (checkpoints at steps 4 and 6)."""
    from helpers import TINY

    from grpo_replay.cli import main

    base = tmp_path_factory.mktemp("corpus")
    overrides = {k: v for k, v in {**TINY, "testbed.cache_dir": str(base / "cache")}.items() if k != "steps"}
    assert main(["train", "--out", str(base / "finished"), "--no-progress", "--steps", "6", *_sets(overrides)]) == 0
    return _sets(overrides), base / "finished", overrides


def _foreign(tmp: Path) -> None:
    (tmp / "notes").mkdir()
    (tmp / "notes" / "draft.txt").write_text("not a run")


def _damage_all(tmp: Path, finished: Path) -> None:
    shutil.copytree(finished, tmp / "run")
    for ckpt in sorted((tmp / "run").glob("ckpt-*")):
        (ckpt / "optim.pt").write_bytes((ckpt / "optim.pt").read_bytes()[:100])


# (id, argv after `train`, prepare(tmp, finished), the key as the user typed it, fix: (argv to drop, argv to add))
BAD = [
    ("groups of one rollout", ["--set", "group_size=1"], None, "group_size",
     (["--set", "group_size=1"], ["--set", "group_size=4"])),
    ("no prompts per step", ["--set", "prompts_per_step=0"], None, "prompts_per_step",
     (["--set", "prompts_per_step=0"], [])),
    ("a negative replay ratio", ["--set", "replay.replay_ratio=-1"], None, "replay.replay_ratio",
     (["--set", "replay.replay_ratio=-1"], ["--set", "replay.replay_ratio=0.5"])),
    ("an unknown composition", ["--set", "replay.composition=mixed"], None, "replay.composition",
     (["--set", "replay.composition=mixed"], ["--set", "replay.composition=pool"])),
    ("a negative age bound", ["--set", "replay.tau_max=-3"], None, "replay.tau_max",
     (["--set", "replay.tau_max=-3"], ["--set", "replay.tau_max=10"])),
    ("a missing data file", ["--reward", "math", "--data", "TMP/math.jsonl"], None, "data",
     (["--data", "TMP/math.jsonl"], ["--data", MATH])),
    ("a folder with someone's files", ["--out", "TMP/notes"], _foreign, "--out",
     (["--out", "TMP/notes"], ["--out", "TMP/new"])),
    ("another config in a finished run's folder", ["--out", "FINISHED", "--steps", "8", "--set", "lr=0.1"], None,
     "lr", (["--set", "lr=0.1"], ["--set", "lr=0.003"])),
    ("every checkpoint damaged", ["--out", "TMP/run", "--steps", "8"], _damage_all, "--out",
     (["--out", "TMP/run"], ["--out", "TMP/new"])),
    ("fewer steps than the run has done", ["--out", "FINISHED", "--steps", "3"], None, "steps",
     (["--steps", "3"], ["--steps", "8"])),
]

GOOD = [
    ("a new run", [], None, "new run (the folder does not exist)"),
    ("the docs' example: all warm-up", ["--steps", "2", "--out", "TMP/run"], None,
     "no replay in this run: its 2 steps are all within replay.warmup_steps=2"),
    ("the GRPO preset", ["--preset", "grpo"], None, "no replay"),
    ("more steps for a finished run", ["--out", "FINISHED", "--steps", "8"], None, "RESUMES from ckpt-000006 of 8"),
    ("a finished run, the same steps", ["--out", "FINISHED", "--steps", "6"], None, "already finished (6 steps)"),
    ("a damaged newest checkpoint", ["--out", "TMP/run", "--steps", "8"], "newest", "RESUMES from ckpt-000004"),
    ("math prompts from a file", ["--reward", "math", "--data", MATH], None, "math_train.jsonl (there)"),
]


def _argv(tiny, tmp, argv):
    """`train ARGV` with the tiny flags that ARGV does not set; FINISHED and TMP stand for the finished run and
    this test's folder."""
    _, finished, overrides = tiny
    argv = [a.replace("FINISHED", str(finished)).replace("TMP", str(tmp)) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp / "run")]
    if "--steps" not in argv:
        argv += ["--steps", "6"]
    own = {v.split("=")[0] for f, v in zip(argv, argv[1:]) if f == "--set"}
    return ["train", *argv, *_sets({k: v for k, v in overrides.items() if k not in own})]


def _refused(report) -> int:
    try:
        report.raise_if_refused()
    except Exception as e:
        return exit_code(e)
    return 0


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_preflight_refuses_a_bad_train_launch_naming_the_key_and_the_fix_passes(tiny, tmp_path, case):
    _, argv, prepare, typed, (drop, add) = case
    if prepare is not None:
        prepare(tmp_path, tiny[1]) if prepare is _damage_all else prepare(tmp_path)
    report = resolve(_argv(tiny, tmp_path, argv), CPU_HOST, None)
    assert _refused(report) == 2, report.render()
    first = report.refusals[0]
    assert typed in first.line() and first.fix, report.render()
    # the fix applied below is the one the refusal names: the --set key or the flag it adds
    words = [value.split("=")[0] if flag == "--set" else flag.lstrip("-") for flag, value in zip(add[::2], add[1::2])]
    assert all(w in first.line() for w in words), (words, first.line())
    fixed = list(argv)
    for i in range(0, len(drop), 2):
        at = next(j for j in range(len(fixed) - 1) if fixed[j:j + 2] == drop[i:i + 2])
        del fixed[at:at + 2]
    fixed_report = resolve(_argv(tiny, tmp_path, [*fixed, *add]), CPU_HOST, None)
    assert not fixed_report.refusals, fixed_report.render()


@pytest.mark.parametrize("case", GOOD, ids=[c[0] for c in GOOD])
def test_preflight_passes_a_valid_train_launch_and_says_what_it_will_do(tiny, tmp_path, case):
    _, argv, prepare, says = case
    if prepare == "newest":
        shutil.copytree(tiny[1], tmp_path / "run")
        (tmp_path / "run" / "summary.json").unlink()
        (tmp_path / "run" / "ckpt-000006" / "optim.pt").write_bytes(b"not a zip")
    before = sorted(tmp_path.rglob("*"))
    report = resolve(_argv(tiny, tmp_path, argv), CPU_HOST, None)
    text = report.render()
    assert not report.refusals, text
    assert says in text, text
    assert sorted(tmp_path.rglob("*")) == before  # the preflight writes nothing


def test_a_damaged_newest_checkpoint_is_named_and_the_older_one_resumed(tiny, tmp_path):
    shutil.copytree(tiny[1], tmp_path / "run")
    (tmp_path / "run" / "summary.json").unlink()
    (tmp_path / "run" / "ckpt-000006" / "optim.pt").write_bytes(b"not a zip")
    text = resolve(_argv(tiny, tmp_path, ["--out", "TMP/run", "--steps", "8"]), CPU_HOST, None).render()
    assert "RESUMES from ckpt-000004 (past 1 damaged newer: ckpt-000006/optim.pt is damaged" in text, text


def test_a_compare_run_that_continues_a_shorter_finished_run_says_so(tiny, tmp_path):
    """compare continues a finished run of the same config with fewer steps (experiments/continuation.py)."""
    from grpo_replay.cli import compare
    from grpo_replay.cli.preflight import _parse
    from grpo_replay.experiments.jobs import _train_one

    overrides = tiny[2]
    sets = _sets({k: v for k, v in overrides.items() if k not in ("eval_every", "testbed.cache_dir")})
    argv = ["--quick", "--seeds", "1", "--arms", "grpo", "--jobs", "1", "--out", str(tmp_path / "cmp"),
            "--cache-dir", overrides["testbed.cache_dir"], *sets]
    short = compare.planned(_parse(compare, [*argv, "--set", "steps=4", "--set", "eval_every=2"], "compare"))
    _train_one(short.specs[0].overrides)
    launch = ["compare", *argv, "--set", "steps=6", "--set", "eval_every=2"]
    text = resolve(launch, CPU_HOST, None).render()
    assert f"continues {short.specs[0].run_dir} (a finished run of 4 steps with this config) to 6 steps" in text, text
    both = resolve(["compare", *argv, "--set", "eval_every=2", "--set", "steps=4"], CPU_HOST, None).render()
    assert "already finished (4 steps)" in both, both
