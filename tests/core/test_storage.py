"""Storage (storage.py): the sum tree, the padded arenas, the packed mask and scattered slots."""
import numpy as np
import pytest
import torch

from grpo_replay import ReplayBuffer, ReplayConfig, sumtree
from grpo_replay.storage import RolloutStorage, StoredRow, SumTree, encode_rows, pack_mask, prefix_lengths, prefix_rows
from helpers import make_batch


@pytest.mark.parametrize("top_max", [4096, 2])  # 2: two levels of running sums from 33 leaves, three from 513
def test_sum_tree_updates_equal_a_rebuild(monkeypatch, top_max):
    monkeypatch.setattr(sumtree, "TOP_MAX", top_max)
    rng = np.random.default_rng(0)
    for _ in range(100):
        n = int(rng.integers(1, 2000 if top_max == 2 else 200))
        tree, w = SumTree(n), np.zeros(n)
        for _ in range(8):
            if rng.random() < 0.5:  # contiguous range (the fast path) or scattered slots
                lo = int(rng.integers(0, n))
                idx = np.arange(lo, int(rng.integers(lo, n)) + 1)
            else:
                idx = rng.choice(n, int(rng.integers(1, n + 1)), replace=False)
            v = rng.random(len(idx))
            tree.set(idx, v)
            w[idx] = v
            ref = SumTree(n)
            ref.rebuild(w)
            assert np.array_equal(tree.t, ref.t)
        assert np.isclose(tree.total, w.sum())
        u = rng.random(50) * tree.total
        assert np.array_equal(tree.find(u), np.searchsorted(np.cumsum(w), u, side="right").clip(max=n - 1))
        assert tree.depth == (1 if top_max == 4096 or n <= 32 else 2 if n <= 512 else 3)
        w[rng.random(n) < 0.5] = 0.0  # free slots, and targets at the very end: never a leaf past n - 1
        tree.rebuild(w)
        if tree.total > 0:
            found = tree.find(np.r_[rng.random(50), 1 - 1e-16] * tree.total)
            assert found.max() < n and (w[found[:-1]] > 0).all()


def _rows(batch, i):
    pm, cm = batch.prompt_mask[i].bool(), batch.completion_mask[i]
    c = int(torch.nonzero(cm).max()) + 1 if cm.any() else 0
    return batch.prompt_ids[i][pm].tolist(), batch.completion_ids[i, :c].tolist(), cm[:c].tolist(), batch.behaviour_logps[i, :c].tolist()


def test_scattered_slots_and_arena_widening_keep_every_row():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None, capacity=None), seed=0)
    a = make_batch(2, 4, seed=1, max_prompt=3, max_completion=4)
    buf.add(a, 0)
    buf.storage.remove(np.array([1, 3, 6]))  # frees scattered slots: the next insert is not contiguous
    b = make_batch(1, 3, seed=2, max_prompt=9, max_completion=11)  # wider: the arenas grow
    b.completion_mask[0, 1] = 0  # an interior zero (e.g. tool output) is kept
    buf.add(b, 1)
    new = [1, 3, 6]
    assert buf.storage.prompt_ids.shape[1] >= 9 and buf.storage.completions.arrays["comp_ids"].shape[1] >= 11
    out = buf.gather(np.array(new))
    for i in range(3):
        assert _rows(out, i) == _rows(b, i)
    kept = [0, 2, 4, 5, 7]
    out = buf.gather(np.array(kept))
    for j, i in enumerate(kept):
        assert _rows(out, j) == _rows(a, i)


def test_prompt_with_interior_zeros_is_compacted_and_ref_presence_must_agree():
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0), seed=0)
    b = make_batch(1, 2, seed=3, max_prompt=6)
    b.prompt_ids = torch.tensor([[0, 7, 8, 0, 9], [0, 0, 0, 5, 6]])
    b.prompt_mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 0, 1, 1]])
    buf.add(b, 0)
    out = buf.gather(buf.storage.valid_slots())
    assert out.prompt_ids.tolist() == [[7, 8, 9], [0, 5, 6]] and out.prompt_mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    with pytest.raises(ValueError, match="ref_logps present in this batch but absent in the stored rows"):
        buf.add(make_batch(1, 2, with_ref=True), 1)


def test_ref_arena_only_with_ref_rows_and_ref_added_after_wider_rows_round_trips(tmp_path):
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=0), seed=0)
    buf.add(make_batch(2, 2, seed=1, max_completion=12), 0)
    assert buf.storage.completions.arrays["ref"].shape[1] == 0  # no reference log-probs stored: no ref arena
    buf.evict(1)  # empty: the next rows may carry ref_logps
    b = make_batch(2, 2, seed=2, max_completion=5, with_ref=True)
    buf.add(b, 1)
    assert buf.storage.completions.arrays["ref"].shape[1] < buf.storage.completions.arrays["comp_ids"].shape[1]
    buf.save(tmp_path / "b")
    loaded = ReplayBuffer.load(tmp_path / "b")
    for x in (buf, loaded):
        out = x.gather(x.storage.valid_slots())
        for i in range(len(b)):
            c = int(b.completion_mask[i].sum())
            assert torch.equal(out.ref_logps[i, :c], b.ref_logps[i, :c])


@pytest.mark.parametrize("width", [0, 1, 7, 8, 9, 17])
def test_pack_mask_keeps_every_position_and_finds_the_last_counted_one(width):
    rng = np.random.default_rng(width)
    mask = (rng.random((20, width)) < 0.5).astype(np.int64) * rng.integers(1, 3, (20, width))  # any nonzero counts
    mask[0] = 0  # an empty completion
    packed, lengths = pack_mask(mask)
    assert packed.dtype == np.uint8 and packed.shape == (20, (width + 7) // 8)
    assert np.array_equal(np.unpackbits(packed, axis=1, count=width).astype(bool), mask != 0)
    last = [int(np.flatnonzero(r)[-1]) + 1 if r.any() else 0 for r in mask]
    assert lengths.tolist() == last


@pytest.mark.parametrize("width", [63, 64, 65, 200, 2045])
@pytest.mark.parametrize("density", [0.002, 0.5])
def test_pack_mask_lengths_across_words_and_bool_masks(width, density):
    # The length search goes a word (64 positions) at a time: last set positions in any word, sparse rows, a
    # bool mask as the trainer's generation hands it over.
    rng = np.random.default_rng(width)
    mask = rng.random((40, width)) < density
    mask[0], mask[1] = False, False
    mask[1, width - 1] = True
    packed, lengths = pack_mask(mask)
    assert np.array_equal(np.unpackbits(packed, axis=1, count=width).astype(bool), mask)
    assert lengths.tolist() == [int(np.flatnonzero(r)[-1]) + 1 if r.any() else 0 for r in mask]


def _columns(n, weight=1.0):
    cols = {k: np.zeros(n) for k in ("birth_step", "advantage", "reward", "group_std", "group_key", "prompt_key")}
    return {**cols, "weight": np.full(n, weight)}


def test_storage_add_remove_and_tokens_directly():
    st = RolloutStorage(initial_slots=2)
    mask = np.array([[1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    packed, clen = pack_mask(mask)
    completion = {"comp_ids": np.arange(12).reshape(3, 4), "mask": packed, "logps": -np.ones((3, 4)), "ref": None}
    prompt = np.array([[0, 5], [6, 7], [0, 0]], np.int32)
    slots = st.add({**_columns(3), "prompt_len": np.array([1, 2, 0]), "comp_len": clen}, prompt, completion)
    assert sorted(slots.tolist()) == [0, 1, 2] and len(st) == 3 and st.slots >= 3 and st.tree.total == 3.0
    row = st.tokens(int(slots[0]))
    assert isinstance(row, StoredRow) and row.ref is None
    assert row.prompt_ids.tolist() == [5] and row.completion_ids.tolist() == [0, 1, 2]
    assert row.mask.tolist() == [True, False, True] and row.logps.dtype == np.float32
    assert st.tokens(int(slots[2])).completion_ids.tolist() == [] and st.col("comp_len")[slots].tolist() == [3, 2, 0]
    st.remove(slots[1:2])
    assert len(st) == 2 and st.tree.total == 2.0 and not st.valid[slots[1]]
    with pytest.raises(KeyError):
        st.remove(slots[1:2])
    one = {k: (v[:1] if v is not None else None) for k, v in completion.items()}
    again = st.add({**_columns(1), "prompt_len": np.array([1]), "comp_len": clen[:1]}, prompt[:1], one)
    assert again.tolist() == [slots[1]]  # the freed slot is reused



@pytest.mark.parametrize("width", [0, 1, 7, 64, 65, 300])  # 64 | 65: the two gathers of prefix_rows
def test_prefix_lengths_only_for_prefix_masks_and_prefix_rows_rebuild_them(width):
    rng = np.random.default_rng(width)
    lengths = rng.integers(0, width + 1, 30)
    lengths[:2] = 0, width  # an empty row and a full one
    mask = np.arange(width)[None, :] < lengths[:, None]
    assert prefix_lengths(mask).tolist() == lengths.tolist()
    assert np.array_equal(prefix_rows(lengths, width), mask)
    assert np.array_equal(prefix_rows(lengths, width, right=True), mask[:, ::-1])
    assert np.array_equal(prefix_rows(lengths + width, width), lengths[:, None] + width > np.arange(width))  # clipped
    for r, c in ((0, width - 1), (2, width - 1)):  # a True past a row's prefix: not a prefix mask
        if width > 1 and not mask[r, c]:
            holey = mask.copy()
            holey[r, c] = True
            assert prefix_lengths(holey) is None


def test_dense_and_packed_masks_gather_and_round_trip_alike(tmp_path):
    """Prefix masks are not packed (rebuilt from comp_len), others are; a draw mixing both, and the same
    draw after save/load, give every row its own mask, and prompt padding is stored as 0."""
    buf = ReplayBuffer(ReplayConfig(warmup_steps=0, tau_max=None, capacity=None), seed=0)
    dense = make_batch(2, 3, seed=1, max_completion=20)
    holey = make_batch(1, 4, seed=2, max_completion=9)
    holey.completion_mask[1, 0] = 0  # an interior zero: this batch is packed
    holey.prompt_ids = holey.prompt_ids.masked_fill(holey.prompt_mask == 0, 77)
    buf.add(dense, 0)
    buf.add(holey, 1)
    assert buf.storage.dense[:6].all() and not buf.storage.dense[6:10].any()
    slots = np.array([7, 0, 9, 3, 6, 5])
    loaded = None
    for x in (buf, None):
        if x is None:
            buf.save(tmp_path / "b")
            x = loaded = ReplayBuffer.load(tmp_path / "b")
        out = x.gather(slots)
        for j, s in enumerate(slots.tolist()):
            src, i = (dense, s) if s < 6 else (holey, s - 6)
            c = int(torch.nonzero(src.completion_mask[i]).max()) + 1
            assert out.completion_mask[j, :c].tolist() == src.completion_mask[i, :c].bool().tolist()
            assert not out.completion_mask[j, c:].any() and out.completion_mask.dtype == torch.bool
            p = int(src.prompt_mask[i].sum())
            assert out.prompt_ids[j, -p:].tolist() == src.prompt_ids[i, -p:].tolist() and not out.prompt_ids[j, :-p].any()
            assert out.prompt_mask[j].tolist() == [False] * (out.prompt_mask.shape[1] - p) + [True] * p
    assert all(torch.equal(getattr(buf.gather(slots), k), getattr(loaded.gather(slots), k))
               for k in ("completion_mask", "completion_ids", "behaviour_logps", "prompt_ids", "prompt_mask"))


def test_tree_read_after_any_adds_and_removes_equals_a_rebuild():
    """add and remove only mark slots; the tree, when read, equals one rebuilt from the weights (exactly)."""
    rng = np.random.default_rng(0)
    st = RolloutStorage(initial_slots=4)  # grows (a rebuild) along the way
    for _ in range(60):
        occupied = st.valid_slots()
        if len(occupied) and rng.random() < 0.4:
            st.remove(rng.choice(occupied, int(rng.integers(1, len(occupied) + 1)), replace=False))
        else:
            n = int(rng.integers(1, 6))
            packed, clen = pack_mask(np.ones((n, 3)))
            completion = {"comp_ids": np.ones((n, 3)), "mask": packed, "logps": np.zeros((n, 3)), "ref": None}
            cols = {**_columns(n), "weight": rng.random(n), "prompt_len": np.ones(n), "comp_len": clen}
            st.add(cols, np.ones((n, 1), np.int32), completion)
        if rng.random() < 0.5:
            ref = SumTree(st.slots)
            ref.rebuild(np.where(st.valid, st.col("weight"), 0.0))
            assert np.array_equal(st.tree.t, ref.t)


def _add_born(st, rng, births):
    n = len(births)
    packed, clen = pack_mask(np.ones((n, 2)))
    completion = {"comp_ids": np.ones((n, 2)), "mask": packed, "logps": np.zeros((n, 2)), "ref": None}
    cols = {**_columns(n), "birth_step": np.asarray(births), "weight": rng.random(n), "prompt_len": np.ones(n),
            "comp_len": clen}
    return st.add(cols, np.ones((n, 1), np.int32), completion)


def test_born_before_equals_a_scan_of_every_row_and_reads_only_the_oldest_entries():
    """Rows listed by birth step (late rows, scattered removals, slots refilled at the same step) give what a
    scan of the birth column gives; entries whose rows are all gone leave the list from its old end."""
    rng = np.random.default_rng(0)
    for trial in range(30):
        st, step = RolloutStorage(initial_slots=4), 0
        for _ in range(40):
            r = rng.random()
            occupied = st.valid_slots()
            if r < 0.3 and len(occupied):
                st.remove(rng.choice(occupied, int(rng.integers(1, len(occupied) + 1)), replace=False))
            elif r < 0.4:  # a late insert, or one batch spanning several birth steps
                _add_born(st, rng, rng.integers(max(0, step - 5), step + 1, int(rng.integers(1, 6))))
            else:
                step += int(rng.integers(0, 2))
                _add_born(st, rng, np.full(int(rng.integers(1, 6)), step))
            cutoff = int(rng.integers(0, step + 2))
            slots = st.valid_slots()
            expected = slots[st.col("birth_step")[slots] < cutoff]
            assert np.array_equal(st.born_before(cutoff), expected)
            births = [b for b, _ in st.births.entries]
            assert births == sorted(births) == st.births.steps
        old = st.born_before(step + 1)
        st.remove(old)
        assert len(st) == 0 and st.births.entries == []  # every entry dropped once its rows are gone


def test_a_draw_updates_only_the_tree_leaves_that_changed(monkeypatch):
    """Between two reads of the tree, adds and removes are recorded, and the read refreshes the sums above
    exactly those leaves (a slot freed and refilled once); the tree still equals a rebuild."""
    rng = np.random.default_rng(1)
    st = RolloutStorage(initial_slots=4096)
    _add_born(st, rng, np.zeros(3000, np.int64))
    st.tree  # noqa: B018  (brought up to date)
    seen = []
    real_refresh = SumTree.refresh
    monkeypatch.setattr(SumTree, "refresh", lambda self, idx: (seen.append(np.asarray(idx).copy()), real_refresh(self, idx)))
    gone = st.born_before(1)[:256]
    st.remove(gone)
    new = _add_born(st, rng, np.ones(256, np.int64))
    assert np.array_equal(np.sort(new), np.sort(gone))  # LIFO reuse: the freed slots are refilled
    ref = SumTree(st.slots)
    ref.rebuild(np.where(st.valid, st.col("weight"), 0.0))
    assert np.array_equal(st.tree.t, ref.t)
    assert len(seen) == 1 and np.array_equal(np.unique(seen[0]), np.sort(gone))


def test_encode_rows_matches_a_per_row_reference_for_every_mask_shape():
    """Prompts empty, whole, left-padded or holed and completion masks empty, whole, prefix or holed, mixed in
    one batch: every row's real prompt tokens come out right-aligned in order and its completion length is its
    last counted position + 1 (each fast path falls back where a row breaks its assumption)."""
    rng = np.random.default_rng(3)
    for trial in range(300):
        n, P, C = int(rng.integers(1, 9)), int(rng.integers(0, 6)), int(rng.integers(0, 6))
        kinds = rng.integers(0, 4, n)  # 0 empty, 1 whole, 2 a contiguous run at the end (left-padded), 3 random
        pm = np.zeros((n, P), bool)
        for i, k in enumerate(kinds):
            pm[i] = {0: np.zeros(P, bool), 1: np.ones(P, bool), 2: np.arange(P) >= rng.integers(0, P + 1),
                     3: rng.random(P) < 0.5}[int(k)]
        cm = np.zeros((n, C), bool)
        for i in range(n):
            cm[i] = np.arange(C) < rng.integers(0, C + 1) if rng.random() < 0.7 else rng.random(C) < 0.5
        pid = rng.integers(1, 100, (n, P)).astype(np.int64)
        rows = encode_rows(pid, pm, np.zeros((n, C), np.int32), cm, np.zeros((n, C), np.float32), None)
        assert rows.prompt_len.tolist() == pm.sum(1).tolist()
        for i in range(n):
            p = int(rows.prompt_len[i])
            kept = rows.prompt_ids[i][rows.prompt_mask[i]]
            assert kept.tolist() == pid[i][pm[i]].tolist() and rows.prompt_mask[i].sum() == p
            assert p == 0 or rows.prompt_mask[i, -p:].all()  # right-aligned
            last = np.flatnonzero(cm[i])
            assert rows.comp_len[i] == (last[-1] + 1 if len(last) else 0)


@pytest.mark.parametrize("layout", ["one run", "two runs", "four runs", "five runs", "descending", "scattered"])
@pytest.mark.parametrize("left", [False, True])
def test_row_writer_writes_every_slot_layout_like_a_row_by_row_copy(layout, left):
    """Through views (up to MAX_RUNS ascending runs) or through a block: each slot's row holds its source row,
    aligned and zero-filled, `keep` zeroing masked positions; no other row changes."""
    from grpo_replay.padding import RowWriter

    rng = np.random.default_rng(len(layout) + left)
    slots = {"one run": np.arange(10, 22), "two runs": np.r_[40:46, 10:16], "four runs": np.r_[1:4, 7:10, 20:23, 30:33],
             "five runs": np.r_[1:3, 5:7, 9:11, 13:15, 17:19, 21:23][:10], "descending": np.arange(30, 18, -1),
             "scattered": rng.permutation(48)[:12]}[layout].astype(np.int64)
    arena = rng.integers(1, 99, (48, 9)).astype(np.int32)
    src = rng.integers(100, 999, (len(slots), 6))
    keep = rng.random(src.shape) < 0.8 if left else None
    expected = arena.copy()
    for row, s in enumerate(slots):
        vals = src[row] * (keep[row] if keep is not None else 1)
        expected[s] = np.r_[np.zeros(3), vals] if left else np.r_[vals, np.zeros(3)]
    writer = RowWriter(slots)
    assert (writer.runs is not None) == (layout in ("one run", "two runs", "four runs"))
    writer.put(arena, src, left=left, keep=keep)
    np.testing.assert_array_equal(arena, expected)
