"""What a stored row costs on verl's v1 trainer, at the paper's lengths: bytes and time, per process.

Measured in one process, in `.venv-verl` (`.venv-verl/bin/python benchmarks/verl_row_store.py`):
- the row store (what its Ray actor holds): the encoded payload bytes of each variant of a row, the packed bytes
  per row (payloads, structure and tag), and the process's RSS growth per row over `--rows` rows; encode+put and
  get+decode time per row (packing and unpacking run in the trainer process);
- the trainer (task-runner) process: the core buffer's payload-free rows, RSS growth and `nbytes` per row;
  verl's sampler holds nothing of them (no stored row is in TransferQueue between updates);
- for comparison, the tensor bytes of the whole row as verl's pipeline leaves it in TransferQueue.
Rows are synthetic, shaped as verl 0.9.1 writes them (tests/integrations/verl_integration/verl_batches.py::v1_row).
Writes JSON to stdout (and to `--out` if given).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integrations",
                                "verl_integration"))
from verl_batches import v1_row  # noqa: E402

from grpo_replay.config import ReplayConfig  # noqa: E402
from grpo_replay.integrations.verl.row_codec import encode_row, encoded_nbytes  # noqa: E402
from grpo_replay.integrations.verl.row_store import RowStore  # noqa: E402
from grpo_replay.integrations.verl.v1_store import FreshRows, TQReplayStore, kept_field  # noqa: E402


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tensor_bytes(row: dict) -> int:
    return sum(v.numel() * v.element_size() for v in row.values() if isinstance(v, torch.Tensor))


def variants(p: int, r: int) -> dict:
    """Rows of the configurations a stored row's size depends on."""
    multi = torch.ones(r, dtype=torch.int64)
    multi[r // 4 : r // 4 + r // 8] = 0  # a tool response inside the completion
    out = {"grpo (default)": v1_row(p, r), "multi-turn mask": v1_row(p, r, mask=multi)}
    kl = v1_row(p, r)
    kl["ref_log_prob"] = kl["old_log_probs"] - 0.01  # actor.use_kl_loss=true
    out["+ ref_log_prob (use_kl_loss)"] = kl
    iw = v1_row(p, r)
    iw["rollout_is_weights"] = torch.rand(r)  # algorithm.rollout_correction.rollout_is set
    out["+ rollout_is_weights"] = iw
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens P")
    ap.add_argument("--response", type=int, default=4096, help="response tokens R")
    ap.add_argument("--rows", type=int, default=2000, help="rows put into the store for the RSS and time figures")
    ap.add_argument("--trainer-rows", type=int, default=100_000, help="payload-free rows for the trainer figure")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args(argv)
    if not (1 <= a.rows <= 20_000) or not (1 <= a.trainer_rows <= 2_000_000) or a.prompt < 1 or a.response < 1:
        ap.error("--rows must be in 1..20000 (about 40 KB each), --trainer-rows in 1..2000000, --prompt and "
                 "--response >= 1")
    p, r = a.prompt, a.response
    result: dict = {"P": p, "R": r, "rows": a.rows, "torch": torch.__version__, "variants": {}}
    for name, row in variants(p, r).items():
        kept = {k: v for k, v in row.items() if kept_field(k, v)}
        result["variants"][name] = {"in TransferQueue (tensor fields)": tensor_bytes(row),
                                    "stored (encoded)": encoded_nbytes(encode_row(kept))}
    rows = [{k: v for k, v in v1_row(p, r, seed=i).items() if kept_field(k, v)} for i in range(8)]
    store = RowStore()
    gc.collect()
    before, t0 = rss(), time.perf_counter()
    for lo in range(0, a.rows, 256):  # a put per step of 256 rows
        n = min(256, a.rows - lo)
        store.put(range(lo, lo + n), [rows[i % 8] for i in range(n)], [{"seq_len": p + r}] * n)
    put_s = time.perf_counter() - t0
    gc.collect()
    grown = rss() - before
    t0 = time.perf_counter()
    for lo in range(0, a.rows, 64):
        store.get(range(lo, min(a.rows, lo + 64)))
    get_s = time.perf_counter() - t0
    result["row store"] = {"packed bytes per row": store.nbytes() / a.rows, "RSS growth per row": grown / a.rows,
                           "encode+put ms per row": 1e3 * put_s / a.rows, "get+decode ms per row": 1e3 * get_s / a.rows}
    del store
    gc.collect()
    # the trainer process: the buffer's payload-free rows (the scalars it samples on)
    n = a.trainer_rows
    fresh = FreshRows(keys=[f"u{i}_0_0" for i in range(n)], tags=[{}] * n, rewards=torch.rand(n).round(),
                      advantages=torch.randn(n), group_ids=torch.arange(n) // 8,
                      prompt_keys=np.arange(n, dtype=np.int64), birth=np.ones(n, dtype=np.int64))
    tq_store = TQReplayStore(ReplayConfig(capacity=None, tau_max=None))
    before = rss()
    ids = np.arange(n, dtype=np.int64)
    tq_store.next_id = n
    tq_store.add(fresh, ids, ids)
    gc.collect()
    st = tq_store.buffer.storage
    result["trainer process"] = {"buffer nbytes per row": st.nbytes() / n, "RSS growth per row": (rss() - before) / n}
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return result


if __name__ == "__main__":
    main()
