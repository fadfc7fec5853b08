"""A stored verl v1 row in compact form, rebuilt bit for bit: what the replay store keeps of each row.

A row as TransferQueue hands it out is a dict {field: value}; tensor fields are one row's tensors (a jagged
batch unbound), other fields Python objects. `encode_row` keeps every field it is given, each in the smallest of
a few forms that rebuilds it exactly: nothing for `arange(n)` (position ids), one value for a constant tensor
(all-ones masks) or for one constant over the response mask (outcome advantages), a
slice of another field (`prompts` and `responses` inside `input_ids`), bits for a 0/1 tensor (masks), a
narrower integer type (token ids as int32), and the tensor itself otherwise (log-probs stay float32). Each form
is checked when the row is encoded by decoding it and comparing bytes, dtype and shape, so a field that does not
fit a form is kept whole: the rebuilt row is what was stored, always.

Simplifications: one row at a time (the costs are per-field tensor operations, small beside a training step);
nested dicts of tensors (multi-modal inputs) are encoded field by field; other objects are kept as they are.
"""
from __future__ import annotations

import pickle
from typing import Any, Callable, Optional

import numpy as np
import torch

INT_TYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
NARROW = (torch.int8, torch.int16, torch.int32)
SLICE_SOURCES = ("input_ids",)
"""Fields whose slices other fields may be (`prompts` = input_ids[:P], `responses` = input_ids[P:])."""
MASK_FIELD = "response_mask"
"""The mask a field constant over it (outcome advantages: A_i where the mask is 1, 0 elsewhere) is stored as."""


def same_bytes(a: Any, b: Any) -> bool:
    """Bit-identical: equal dtype, shape and bytes for tensors (so -0.0 differs from 0.0 and NaNs compare);
    recursively for dicts; `==` for other objects."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        return a.numel() == 0 or torch.equal(_as_bytes(a), _as_bytes(b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_bytes(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(t.numel(), dtype=t.dtype)  # unit stride, whatever the strides of `t`
    return flat.copy_(t.detach().reshape(-1)).view(torch.uint8)


def _fill(value: torch.Tensor, shape) -> torch.Tensor:
    return torch.empty(shape, dtype=value.dtype).copy_(value.reshape(()))


# --- the forms: (name, encode(t, row) -> payload or None, decode(payload, dtype, shape, row) -> tensor) -------
def _enc_const(t: torch.Tensor, _row) -> Optional[torch.Tensor]:
    return t.reshape(-1)[:1].clone() if t.numel() else None


def _dec_const(p, dtype, shape, _row):
    return _fill(p, shape)


def _enc_arange(t: torch.Tensor, _row):
    return () if t.dtype in INT_TYPES and t.dim() == 1 else None


def _dec_arange(_p, dtype, shape, _row):
    return torch.arange(shape[0], dtype=dtype)


def _enc_slice(t: torch.Tensor, row):
    if t.dim() != 1:
        return None
    for name in SLICE_SOURCES:
        src = row.get(name)
        if isinstance(src, torch.Tensor) and src.dim() == 1 and src.dtype == t.dtype and len(src) >= len(t):
            for start in (0, len(src) - len(t)):
                if torch.equal(src[start : start + len(t)], t):
                    return (name, start)
    return None


def _dec_slice(p, dtype, shape, row):
    name, start = p
    return row[name][start : start + shape[0]].clone()


def _enc_masked_const(t: torch.Tensor, row):
    mask = row.get(MASK_FIELD)
    if t.dim() != 1 or not isinstance(mask, torch.Tensor) or mask.shape != t.shape or not t.is_floating_point():
        return None
    on = torch.nonzero(mask).flatten()
    return t[on[:1]].clone() if len(on) else None


def _dec_masked_const(p, dtype, shape, row):
    return p.reshape(()) * row[MASK_FIELD].to(dtype)  # as verl computes it: signed zeros where the mask is 0


def _enc_bits(t: torch.Tensor, _row):
    if t.dtype not in (*INT_TYPES, torch.bool):
        return None
    flat = t.reshape(-1)
    if bool(((flat != 0) & (flat != 1)).any()):
        return None
    return np.packbits(flat.numpy().astype(np.uint8))


def _dec_bits(p, dtype, shape, _row):
    n = int(np.prod(shape)) if len(shape) else 1
    return torch.from_numpy(np.unpackbits(p, count=n).astype(np.int64)).to(dtype).reshape(shape)


def _enc_narrow(t: torch.Tensor, _row):
    if t.dtype not in (torch.int16, torch.int32, torch.int64) or not t.numel():
        return None
    lo, hi = int(t.min()), int(t.max())
    for d in NARROW:
        if torch.iinfo(d).min <= lo and hi <= torch.iinfo(d).max and torch.iinfo(d).bits < torch.iinfo(t.dtype).bits:
            return t.to(d)
    return None


def _dec_narrow(p, dtype, shape, _row):
    return p.to(dtype).reshape(shape)


Form = tuple[str, Callable, Callable]
FORMS: tuple[Form, ...] = (
    ("const", _enc_const, _dec_const),
    ("arange", _enc_arange, _dec_arange),
    ("slice", _enc_slice, _dec_slice),
    ("masked_const", _enc_masked_const, _dec_masked_const),
    ("bits", _enc_bits, _dec_bits),
    ("narrow", _enc_narrow, _dec_narrow),
)
DECODE = {name: dec for name, _, dec in FORMS}
ORDER = (*SLICE_SOURCES, MASK_FIELD)
"""Encoded first, so the fields encoded as their slice or over their mask can be rebuilt from them."""


def encode_value(t: Any, row: dict) -> tuple:
    """One field: (form, dtype, shape, payload), the first form that rebuilds `t` bit for bit, else the tensor."""
    if isinstance(t, dict):
        return ("dict", None, None, {k: encode_value(v, {}) for k, v in t.items()})
    if not isinstance(t, torch.Tensor):
        return ("obj", None, None, t)
    t = t.detach().cpu()
    for name, enc, dec in FORMS:
        p = enc(t, row)
        if p is not None and same_bytes(dec(p, t.dtype, t.shape, row), t):
            return (name, t.dtype, tuple(t.shape), p)
    return ("raw", t.dtype, tuple(t.shape), t.contiguous().clone())


def decode_value(enc: tuple, row: dict) -> Any:
    form, dtype, shape, p = enc
    if form == "dict":
        return {k: decode_value(v, {}) for k, v in p.items()}
    if form == "obj":
        return p
    if form == "raw":
        return p.clone()
    return DECODE[form](p, dtype, shape, row)


def encode_row(row: dict) -> dict:
    """{field: encoded} of one row (a dict {field: value})."""
    names = [n for n in ORDER if n in row] + [n for n in row if n not in ORDER]
    # a field is rebuilt from those encoded before it, never from itself
    return {n: encode_value(row[n], {k: row[k] for k in names[:i]}) for i, n in enumerate(names)}


def decode_row(enc: dict) -> dict:
    """The row `encode_row` was given, bit for bit (fields in the order it encoded them)."""
    out: dict = {}
    for n, e in enc.items():  # slice sources and the mask come first, as encode_row put them
        out[n] = decode_value(e, out)
    return out


def encoded_nbytes(enc: Any) -> int:
    """Bytes of the payloads (tensors and arrays) of an encoded row or value; objects count 0."""
    if isinstance(enc, dict):
        return sum(encoded_nbytes(v) for v in enc.values())
    if isinstance(enc, tuple) and len(enc) == 4 and isinstance(enc[0], str):
        form, _, _, p = enc
        if form == "dict":
            return encoded_nbytes(p)
        if isinstance(p, torch.Tensor):
            return p.numel() * p.element_size()
        if isinstance(p, np.ndarray):
            return int(p.nbytes)
    return 0


def unbind_rows(data: Any, n: int) -> list[dict]:
    """Rows of a TensorDict read from TransferQueue: [{field: one row's value}] (jagged tensors unbound, dense
    ones split on the batch dimension, non-tensor stacks listed)."""
    rows: list[dict] = [{} for _ in range(n)]
    for name in data.keys():
        for i, v in enumerate(_unbind(data.get(name), n)):
            rows[i][name] = v
    return rows


def _unbind(v: Any, n: int) -> list:
    from tensordict import NonTensorData, NonTensorStack, TensorDictBase

    if isinstance(v, torch.Tensor):
        return list(v.unbind()) if v.is_nested else list(v.unbind(0))
    if isinstance(v, NonTensorStack):
        return list(v.tolist())
    if isinstance(v, NonTensorData):
        return [v.data] * n
    if isinstance(v, TensorDictBase):  # a nested TensorDict: a dict per row
        parts = {k: _unbind(v.get(k), n) for k in v.keys()}
        return [{k: parts[k][i] for k in parts} for i in range(n)]
    if isinstance(v, (list, tuple)) and len(v) == n:
        return list(v)
    raise TypeError(f"cannot split a {type(v).__name__} field into {n} rows")


def pack_row(enc: dict, extra: Any = None) -> bytes:
    """An encoded row (and `extra`, e.g. its tag) as one bytes object: the pickled structure, then every payload's
    bytes. One object per stored row: a store of many rows holds little more than their bytes (as Python objects,
    the structure alone would cost about 4 KB a row)."""
    chunks: list[bytes] = []
    size = [0]  # payload bytes so far: the next payload's offset

    def take(p, form):
        if form == "obj":  # kept as it is (pickled with the structure)
            return ("value", p)
        if isinstance(p, torch.Tensor):
            raw = _as_bytes(p).numpy().tobytes()
            kind, dtype, shape = "tensor", str(p.dtype).removeprefix("torch."), tuple(p.shape)
        elif isinstance(p, np.ndarray):
            raw = np.ascontiguousarray(p).tobytes()
            kind, dtype, shape = "array", p.dtype.str, p.shape
        else:
            return ("value", p)
        chunks.append(raw)
        size[0] += len(raw)
        return (kind, dtype, shape, size[0] - len(raw), len(raw))

    def walk(e):
        form, dtype, shape, p = e
        dtype = None if dtype is None else str(dtype).removeprefix("torch.")
        return (form, dtype, shape, {k: walk(v) for k, v in p.items()} if form == "dict" else take(p, form))

    head = pickle.dumps(({n: walk(e) for n, e in enc.items()}, extra), protocol=pickle.HIGHEST_PROTOCOL)
    return len(head).to_bytes(8, "little") + head + b"".join(chunks)


def unpack_row(packed: bytes) -> tuple[dict, Any]:
    """(the encoded row, `extra`) that `pack_row` packed."""
    n = int.from_bytes(packed[:8], "little")
    meta, extra = pickle.loads(packed[8 : 8 + n])
    base = 8 + n

    def give(ref):
        if ref[0] == "value":
            return ref[1]
        kind, dtype, shape, start, size = ref
        raw = np.frombuffer(packed, np.uint8, count=size, offset=base + start).copy()
        if kind == "array":
            return raw.view(np.dtype(dtype)).reshape(shape)
        if not size:
            return torch.empty(shape, dtype=getattr(torch, dtype))
        return torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)

    def walk(e):
        form, dtype, shape, p = e
        dtype = None if dtype is None else getattr(torch, dtype)
        return (form, dtype, shape, {k: walk(v) for k, v in p.items()} if form == "dict" else give(p))

    return {n: walk(e) for n, e in meta.items()}, extra
