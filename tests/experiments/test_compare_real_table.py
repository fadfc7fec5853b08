"""The paper's table from benchmark rows (no model): means, t-intervals and paired differences over seeds, the
benchmark mean, pass@k, AES and the length split, checked against hand-computed numbers."""
import json
import math

import pytest

from grpo_replay.eval.metrics import aes
from grpo_replay.experiments import paper_table
from grpo_replay.experiments.final_eval import BenchSettings, delete_checkpoints, final_model_dir, missing_benchmarks, result_path
from grpo_replay.experiments.claims import check_claims
from grpo_replay.experiments.jobs import RunSpec
from grpo_replay.experiments.stats import t_quantile

BS = BenchSettings(benchmarks=("b1", "b2"), n=4, ks=(1, 4))


def _row(acc, p4, lc, li):
    return {"mean@n": acc, "pass@k": {"1": acc, "4": p4}, "length": {"all": (lc + li) / 2, "correct": lc, "incorrect": li},
            "num_problems": 1, "n": 4, "problems": []}


def _write(run_dir, rows):
    for label, row in rows.items():
        p = result_path(run_dir, label, BS)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"row": row}))


@pytest.fixture
def specs(tmp_path):
    # acc per (arm, seed, benchmark); lengths chosen so every AES and relative change is non-trivial
    acc = {("grpo", 0): (0.2, 0.4), ("grpo", 1): (0.3, 0.5), ("paper", 0): (0.3, 0.5), ("paper", 1): (0.5, 0.5)}
    out = []
    for (arm, seed), (a1, a2) in acc.items():
        rd = tmp_path / arm / f"seed{seed}"
        lc = 100.0 if arm == "grpo" else 120.0
        _write(rd, {"b1": _row(a1, 2 * a1, lc, 50.0), "b2": _row(a2, min(1.0, 2 * a2), lc, 50.0)})
        out.append(RunSpec(arm, seed, {}, rd, 2))
    return out


def test_table_numbers_by_hand(specs):
    runs, missing = paper_table.load_bench_runs(specs, BS)
    assert missing == []
    st = paper_table.table_stats(runs, BS.labels(), list(BS.ks))
    # paper's mean accuracy per seed: (0.3+0.5)/2 = 0.4 and (0.5+0.5)/2 = 0.5; GRPO's 0.3 and 0.4
    m = st["paper"]["acc"]["mean"]
    assert math.isclose(m["mean"], 0.45)
    half = t_quantile(1) * math.sqrt(0.005) / math.sqrt(2)  # sd of (0.4, 0.5) = sqrt(0.005)
    assert math.isclose(m["hi"] - m["mean"], half)
    d = st["paper"]["acc_diff"]["mean"]  # paired: 0.1 and 0.1 -> sd 0, interval collapses to the mean
    assert math.isclose(d["mean"], 0.1) and math.isclose(d["lo"], 0.1) and math.isclose(d["hi"], 0.1)
    assert math.isclose(st["paper"]["acc_diff"]["b1"]["mean"], (0.1 + 0.2) / 2)
    assert math.isclose(st["paper"]["pass@k"]["4"]["mean"], ((0.6 + 1.0) / 2 + (1.0 + 1.0) / 2) / 2)
    assert math.isclose(st["paper"]["len_correct_rel"]["mean"], 0.2)
    assert math.isclose(st["paper"]["len_incorrect_rel"]["mean"], 0.0)
    want = [aes(0.4, 85.0, 0.3, 75.0), aes(0.5, 85.0, 0.4, 75.0)]
    assert math.isclose(st["paper"]["aes"]["mean"], sum(want) / 2)

    claims = {c["claim"]: c for c in check_claims(paper_table.claim_runs(runs))}
    beats = claims["Replay (the paper's method) beats GRPO"]
    assert math.isclose(beats["numbers"]["sampled"]["mean"], 0.1)

    md = paper_table.markdown(st, ["grpo", "paper"], {"grpo": "GRPO", "paper": "paper"}, BS, missing)
    assert "| paper | 2 | 40.0 [" in md and "+10.0 [+10.0, +10.0]*" in md


def test_a_run_missing_one_benchmark_is_listed_not_averaged(specs):
    result_path(specs[-1].run_dir, "b2", BS).unlink()
    runs, missing = paper_table.load_bench_runs(specs, BS)
    assert missing == ["paper/seed1"] and len(runs["paper"]) == 1
    assert missing_benchmarks(specs[-1].run_dir, BS) == ["b2"]
    # another settings key sees nothing evaluated
    assert missing_benchmarks(specs[0].run_dir, BenchSettings(benchmarks=("b1", "b2"), n=4, ks=(1, 4), temperature=0.7)) == ["b1", "b2"]


def test_final_model_dir_and_deletion(tmp_path):
    rd = tmp_path / "run"
    for step in (1, 2):
        (rd / f"ckpt-00000{step}" / "model").mkdir(parents=True)
        (rd / f"ckpt-00000{step}" / "model" / "config.json").write_text("{}")
        (rd / f"ckpt-00000{step}" / "trainer_state.json").write_text("{}")
    assert final_model_dir(rd) == rd / "ckpt-000002" / "model"
    (rd / "final").mkdir()
    (rd / "final" / "config.json").write_text("{}")
    assert final_model_dir(rd) == rd / "final"  # TRL's saved model wins
    assert delete_checkpoints(rd) == ["ckpt-000001", "ckpt-000002", "final"]
    assert final_model_dir(rd) is None and (rd / "bench" / "checkpoints_deleted.json").exists()


def test_bench_settings_validation():
    with pytest.raises(ValueError, match=r"--eval-k=\[8\] is invalid"):
        BenchSettings(n=4, ks=(8,))
    with pytest.raises(ValueError, match="--eval-backend='hf' is invalid; allowed: transformers, vllm"):
        BenchSettings(backend="hf")
    # device and batch size change where and how fast, not the numbers: same key
    assert BenchSettings(device="cuda", batch_size=32).key() == BenchSettings().key() != BenchSettings(n=32).key()
