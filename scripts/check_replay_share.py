"""Did a finished run replay what it was configured to? Reads the run's per-step metrics and checks the realised
replay share against ratio / (1 + ratio): some step replayed, at least one step realised the configured share, and
none exceeded it. A run that replays nothing (the method silently GRPO) or a fixed fraction short of the ratio
fails, whatever its exit code was. Used by scripts/gpu_smoke.sh after the builtin, trl, trl-async and verl paths.

RUN is a run folder (the built-in trainer's metrics.jsonl, or TRL's trainer_state.json log history) or a JSON-lines
file: rows of metrics, or verl's `file` logger (trainer.logger=[...,"file"], written to $VERL_FILE_LOGGER_PATH),
whose rows are {"step": N, "data": {metric: value}}.

    python scripts/check_replay_share.py RUN --ratio 0.5      # exit 0 ok, 1 the share is wrong, 2 no metrics
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHARE, COUNT = "replay/share", "replay/count"
LEGACY_COUNT = "replay/rows"  # TRL's earlier name


def _jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file; a verl `file` logger row {"step", "data"} becomes its metrics and step."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{**r["data"], "step": r["step"]} if isinstance(r.get("data"), dict) and "step" in r else r for r in rows]


def step_rows(run: Path) -> list[dict]:
    """One dict per logged training step with a replay share, from whichever log the run has."""
    if run.is_file():
        rows = _jsonl(run)
    elif (run / "metrics.jsonl").is_file():
        rows = _jsonl(run / "metrics.jsonl")
    elif (run / "trainer_state.json").is_file():
        rows = json.loads((run / "trainer_state.json").read_text())["log_history"]
    else:
        raise FileNotFoundError(f"{run}: neither a metrics file nor a folder with metrics.jsonl or trainer_state.json")
    out = []
    for r in rows:
        if SHARE in r:
            out.append({"step": r.get("step"), "share": float(r[SHARE]),
                        "count": float(r.get(COUNT, r.get(LEGACY_COUNT, 0.0)))})
    return out


def check(rows: list[dict], ratio: float, tol: float) -> list[str]:
    """The problems with the realised share (empty: as configured)."""
    target = ratio / (1 + ratio)
    if not rows:
        return ["no step logged replay/share"]
    problems = []
    if not any(r["count"] > 0 for r in rows):
        problems.append(f"no replayed row in {len(rows)} steps: the run trained as GRPO (replay/count 0 at every step)")
    best = max(r["share"] for r in rows)
    if best < target - tol:
        problems.append(f"the highest realised replay share is {best:.4f}, short of ratio/(1+ratio) = {target:.4f}")
    over = [r for r in rows if r["share"] > target + tol]
    if over:
        problems.append(f"step {over[0]['step']} replayed a share of {over[0]['share']:.4f} > {target:.4f}")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path)
    p.add_argument("--ratio", type=float, required=True, help="the run's replay ratio (0.5 for the paper preset)")
    p.add_argument("--tol", type=float, default=0.02, help="allowed difference of a step's share from the target")
    args = p.parse_args(argv)
    try:
        rows = step_rows(args.run)
    except (FileNotFoundError, KeyError, json.JSONDecodeError) as e:
        print(f"check_replay_share: {e}", file=sys.stderr)
        return 2
    problems = check(rows, args.ratio, args.tol)
    shares = " ".join(f"{r['share']:.3f}" for r in rows)
    if problems:
        print(f"check_replay_share: {args.run}: " + "; ".join(problems) + f" (shares per step: {shares})",
              file=sys.stderr)
        return 1
    print(f"replay share per step: {shares} (target {args.ratio / (1 + args.ratio):.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
