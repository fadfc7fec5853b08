"""Where verl v1's stored rows live between their fresh update and their replays: outside TransferQueue.

`RowStore` holds each stored row, encoded by `row_codec` and packed with the tag its replay copy gets into one
bytes object, by the buffer's insertion number. In a run it is a Ray actor of its own (`remote_row_store`, on the
trainer's node, no CPU reserved), so the trainer process keeps only the buffer's scalars and verl's sampler, which
lists every TransferQueue key on each poll, never sees a stored row; a replayed row is put back into TransferQueue
only for the update that reads it. The rows are saved with verl's checkpoints in a file of their own.

Example (in-process; `remote_row_store()` gives the same methods on an actor):

    >>> import torch
    >>> store = RowStore()
    >>> store.put([0], [{"input_ids": torch.arange(5) + 7}], [{"seq_len": 5}])
    >>> store.get([0])[0][0]["input_ids"].tolist()
    [7, 8, 9, 10, 11]
"""
from __future__ import annotations

import ctypes
import os
import pickle
from typing import Optional, Sequence

import numpy as np

from .row_codec import decode_row, encode_row, pack_row, unpack_row

ROWS_FORMAT = 1


def pack_rows(rows: Sequence[dict], tags: Sequence[dict]) -> list[bytes]:
    """Encode rows (dicts {field: value}) with their tags, one bytes object each (`pack_row`). Run where the rows
    are: a tensor unbound from a batch is a view of the whole batch's buffer, and sending it to another process
    would send that buffer whole."""
    return [pack_row(encode_row(row), dict(tag)) for row, tag in zip(rows, tags, strict=True)]


def unpack_rows(packed: Sequence[bytes]) -> tuple[list[dict], list[dict]]:
    """(rows rebuilt bit for bit, their tags) from `pack_rows`' bytes."""
    unpacked = [unpack_row(b) for b in packed]
    return [decode_row(enc) for enc, _ in unpacked], [tag for _, tag in unpacked]


class RowStore:
    """Packed rows (`pack_rows`: a row with its tag as one bytes object) by id, the buffer's insertion number of
    the row. `put` / `get` pack and unpack in the calling process, `put_packed` / `get_packed` move the bytes."""

    def __init__(self):
        self.rows: dict[int, bytes] = {}

    def put_packed(self, ids: Sequence[int], packed: Sequence[bytes]) -> int:
        """Keep packed rows under `ids`; returns their bytes."""
        for i, b in zip(ids, packed, strict=True):
            self.rows[int(i)] = b
        _trim_heap()
        return sum(len(b) for b in packed)

    def get_packed(self, ids: Sequence[int]) -> list[bytes]:
        """The packed rows `ids`; KeyError naming the ids it does not hold."""
        missing = [int(i) for i in ids if int(i) not in self.rows]
        if missing:
            raise KeyError(f"stored rows {missing[:3]} ({len(missing)}) are not in the replay row store")
        return [self.rows[int(i)] for i in ids]

    def put(self, ids: Sequence[int], rows: Sequence[dict], tags: Sequence[dict]) -> int:
        """Encode and keep rows (dicts {field: value}) with their tags under `ids`; returns the bytes kept."""
        return self.put_packed(ids, pack_rows(rows, tags))

    def get(self, ids: Sequence[int]) -> tuple[list[dict], list[dict]]:
        """(rows rebuilt bit for bit, their tags) for `ids`."""
        return unpack_rows(self.get_packed(ids))

    def drop(self, ids: Sequence[int]) -> int:
        n = 0
        for i in ids:
            n += self.rows.pop(int(i), None) is not None
        return n

    def keep_only(self, ids: Sequence[int]) -> int:
        """Drop every row whose id is not in `ids`; returns how many were dropped."""
        keep = {int(i) for i in ids}
        return self.drop([i for i in list(self.rows) if i not in keep])

    def ids(self) -> np.ndarray:
        return np.array(sorted(self.rows), dtype=np.int64)

    def nbytes(self) -> int:
        """Bytes of the packed rows (payloads, structure and tags)."""
        return sum(len(b) for b in self.rows.values())

    def save(self, path: str) -> None:
        """Write every row to `path` (through a temporary file, so a crash leaves the old file or none)."""
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:  # streamed: no second copy of the rows in memory
            pickle.dump({"format": ROWS_FORMAT, "rows": self.rows}, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)

    def load(self, path: str) -> int:
        """Replace the rows by those saved at `path`; a file that is not one is an error naming it."""
        try:
            with open(path, "rb") as f:
                state = pickle.load(f)
        except FileNotFoundError:
            raise
        except Exception as e:  # a truncated or foreign file: say which, not an unpickling trace
            raise ValueError(f"{path}: not a readable replay row file ({type(e).__name__}: {e})") from e
        if not isinstance(state, dict) or state.get("format") != ROWS_FORMAT:
            raise ValueError(f"{path}: replay row file format {state.get('format') if isinstance(state, dict) else '?'}"
                             f", this version reads {ROWS_FORMAT}")
        self.rows = state["rows"]
        return len(self.rows)


def _trim_heap() -> None:
    """Hand the heap's free pages back (glibc): encoding leaves holes between the kept rows that the allocator
    would otherwise keep, about 10 % of the rows' bytes (measured: benchmarks/verl_row_store.py)."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC = None


class RemoteRowStore:
    """`RowStore`'s methods, called on a Ray actor and waited for; `put` and `get` pack and unpack here, so only
    the packed bytes travel."""

    def __init__(self, actor):
        self.actor = actor

    def put(self, ids: Sequence[int], rows: Sequence[dict], tags: Sequence[dict]) -> int:
        return self.put_packed(list(ids), pack_rows(rows, tags))

    def get(self, ids: Sequence[int]) -> tuple[list[dict], list[dict]]:
        return unpack_rows(self.get_packed(list(ids)))

    def __getattr__(self, name):
        import ray

        method = getattr(self.actor, name)
        return lambda *a, **k: ray.get(method.remote(*a, **k))


def remote_row_store(name: Optional[str] = None) -> RemoteRowStore:
    """A `RowStore` actor on this process's node (its checkpoint files are written where the buffer's are),
    reserving no CPU (it only holds and copies rows)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    actor = ray.remote(RowStore).options(
        num_cpus=0, name=name, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
    ).remote()
    return RemoteRowStore(actor)
