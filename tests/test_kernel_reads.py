"""Rows read by the C kernel straight from shard files (``_kernels.read_rows``).

The kernel opens the shards a batch needs, checks their headers, reads the rows' 16-byte
index entries and then their chunks, shard by shard: no shard's chunk index is parsed into
Python (a frame field of many chunks holds them compactly in the kernel's own table:
``tests/test_entry_table.py``), and at most a bounded number of descriptors stay open.
These tests read real stores written by ``Store.add`` and compare with the general path
(numcodecs, parsed indexes).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_batch_path import FRAME, frame, make_store, write

import expstore as es
from expstore.storage import backend_for
from expstore.storage.native.kernels import native
from expstore.storage.read import ShardReader
from expstore.storage.read.fd_table import STATE_LEN

if native is None and os.environ.get("EXPSTORE_REQUIRE_NATIVE"):
    raise RuntimeError("expstore.storage.native._kernels was not built (EXPSTORE_REQUIRE_NATIVE=1)")
pytestmark = pytest.mark.skipif(native is None, reason="C kernel not built")


def _filled(tmp_path, capacity=512, shard_rows=16, n=450):
    """A store of ``n`` steps (final rows included: fewer rows than ``capacity``)."""
    store = make_store(tmp_path / "s.zarr", capacity=capacity, shard_rows=shard_rows)
    write(store, 0, 0, n)
    store.flush()
    rows = np.arange(store.capacity)
    steps = store.index.steps(rows)
    keep = (steps >= 0) & (steps < store.index.count[0])
    assert store.index.count[0] < capacity
    return store, rows[keep], steps[keep]


def _general(store):
    general = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0)
    general.tables = {}
    return general


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("name", ["obs", "action", "reward", "step"])
def test_batches_are_read_without_holding_any_shard_index(tmp_path, name) -> None:
    """Frames and (beyond the decoded-values budget) scalars come from the kernel: the
    reader opens no shard version of its own (no chunk index parsed or kept)."""
    store, rows, steps = _filled(tmp_path)
    # (a budget of its own: the default one shrinks with the readers other tests left)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0,
                         values_budget=0, max_fds=1024)
    general = _general(store)
    f = store.layout.fields[name]
    rng = np.random.default_rng(0)
    for _ in range(20):
        pick = rng.choice(len(rows), 32, replace=False)
        got = np.zeros((32, *f.shape), f.dtype)
        expect = np.zeros_like(got)
        assert reader.read(name, rows[pick], steps[pick], got).all()
        assert general.read(name, rows[pick], steps[pick], expect).all()
        assert np.array_equal(got, expect)
    assert not reader.heads  # nothing went through the general path
    fds = reader.tables[name].fds
    # each shard opened once, and again at most once more: when a step above the
    # committed count it was opened at (its trusted count) is first asked for
    n_shards = len(np.unique(rows // store.layout.shard_rows))
    assert n_shards <= fds.opened < 2 * n_shards
    assert reader.stats.requests > 0
    store.close()


def test_descriptors_held_stay_within_the_budget(tmp_path) -> None:
    store, rows, steps = _filled(tmp_path, capacity=1024, shard_rows=16, n=980)  # 64 shards
    L = store.layout
    n_meta = len(L.fields) - len(L.spec.fields)  # the store's own fields: 16 each
    reader = ShardReader(backend_for(store.url), L, row_cache_bytes=0,
                         max_fds=8 * len(L.spec.fields) + 16 * n_meta)
    table = reader.tables["obs"].fds
    assert len(table.ring) == 8
    before = _open_fds()
    out = np.zeros((len(rows), *FRAME), np.uint8)
    assert reader.read("obs", rows, steps, out).all()  # every shard in one read
    for i, s in enumerate(steps):
        assert np.array_equal(out[i], frame(0, int(s)))
    assert int((table.tab[:, table.FD] >= 0).sum()) <= 8
    assert _open_fds() - before <= 8
    assert table.opened >= 60  # shards were opened again as older ones were closed
    reader.close()
    assert _open_fds() <= before
    assert not (table.tab[:, table.FD] >= 0).any()
    store.close()


def test_rows_a_version_does_not_hold_are_left_to_the_caller(tmp_path) -> None:
    """Overwritten rows, steps never written, and a missing shard: not delivered by the
    kernel; the reader reports them as not delivered (stale), never as other rows."""
    store, rows, steps = _filled(tmp_path, capacity=64, shard_rows=16, n=56)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0)
    out = np.zeros((len(rows), *FRAME), np.uint8)
    assert reader.read("obs", rows, steps, out).all()
    write(store, 0, 56, 20)  # part of a new lap: shard 0 now holds newer steps
    store.flush()
    new_steps = store.index.steps(rows)
    moved = new_steps != steps
    assert moved.any() and (~moved).any()
    fresh = np.zeros_like(out)
    ok = reader.read("obs", rows[moved], new_steps[moved], fresh[: int(moved.sum())])
    assert ok.all()  # the new versions are opened
    for i, s in enumerate(new_steps[moved]):
        assert np.array_equal(fresh[i], frame(0, int(s)))
    again = np.zeros_like(out)
    ok = reader.read("obs", rows, steps, again)
    # the old steps of rewritten rows, and of the rows of their shard's last lap (dropped
    # when the new lap entered the shard): not delivered, as by the general path
    expect = np.zeros_like(out)
    assert np.array_equal(ok, _general(store).read("obs", rows, steps, expect))
    assert not ok[moved].any() and ok[rows >= 16].all()
    assert np.array_equal(again[ok], out[ok])
    never = steps[~moved][:4] + 1000  # steps never written: not delivered
    assert not reader.read("obs", rows[~moved][:4], never, again[:4]).any()
    (tmp_path / "s.zarr" / store.layout.shard_key("obs", 3)).unlink()  # a missing shard
    sel = rows // 16 == 3
    assert sel.any()
    fresh_reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0)
    assert not fresh_reader.read("obs", rows[sel], steps[sel], again[: int(sel.sum())]).any()
    store.close()


def test_a_shard_whose_header_fails_its_check_is_reported_by_name(tmp_path) -> None:
    store, rows, steps = _filled(tmp_path, capacity=64, shard_rows=16, n=56)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0)
    key = store.layout.shard_key("obs", 1)
    path = tmp_path / "s.zarr" / key
    data = bytearray(path.read_bytes())
    at = 16 * store.layout.chunks_per_shard("obs") + 4 + 8  # the header's first step
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    sel = rows // 16 == 1
    out = np.zeros((int(sel.sum()), *FRAME), np.uint8)
    with pytest.raises(es.StoreCorruptError, match=key.replace("/", ".")):
        reader.read("obs", rows[sel], steps[sel], out)
    other = rows // 16 == 2  # the other shards still read
    out = np.zeros((int(other.sum()), *FRAME), np.uint8)
    assert reader.read("obs", rows[other], steps[other], out).all()
    store.close()


def test_kernel_rows_checks_its_arguments(tmp_path) -> None:
    store, rows, steps = _filled(tmp_path, capacity=64, shard_rows=16, n=56)
    fds = ShardReader(backend_for(store.url), store.layout).tables["obs"].fds
    flat = np.zeros((2, FRAME[0] * FRAME[1]), np.uint8)
    ok = np.zeros(2, np.uint8)
    state = fds.state_of_reads
    with pytest.raises(IndexError, match="out of range"):  # shard beyond the table
        native.read_rows(state, np.array([0, 99], np.int64), np.zeros(2, np.int64),
                         np.zeros(2, np.int64), np.arange(2), flat, ok)
    with pytest.raises(IndexError, match="out of range"):  # a destination row beyond out
        native.read_rows(state, np.zeros(2, np.int64), np.zeros(2, np.int64),
                         np.zeros(2, np.int64), np.array([0, 2]), flat, ok)
    with pytest.raises(ValueError, match="one entry per row"):
        native.read_rows(state, np.zeros(2, np.int64), np.zeros(1, np.int64),
                         np.zeros(2, np.int64), np.arange(2), flat, ok)
    with pytest.raises(TypeError):  # the state is a ReadState
        native.read_rows(object(), np.zeros(2, np.int64), np.zeros(2, np.int64),
                         np.zeros(2, np.int64), np.arange(2), flat, ok)
    with pytest.raises(ValueError, match=f"state of {STATE_LEN}"):
        native.ReadState(fds.prefix, fds.suffix, fds.n_chunks, fds.chunk_rows, 4,
                         flat.shape[1], False, np.array([60], np.int64), fds.tab, fds.ring,
                         np.zeros(2, np.int64), fds.entries)
    assert not (fds.tab[:, fds.FD] >= 0).any()  # nothing was opened
    store.close()


def test_sampling_a_store_with_more_shards_than_descriptors(tmp_path) -> None:
    """``store.sample`` through the kernel with a descriptor budget far below the shard
    count: every batch holds its anchor steps' frames."""
    from test_batch_path import _check_sampled

    store, _, _ = _filled(tmp_path, capacity=2048, shard_rows=16, n=1980)
    store.close()
    store = es.open(tmp_path / "s.zarr", cache_bytes=32 << 10)
    L = store.layout
    store._reader = ShardReader(store.backend, L, row_cache_bytes=32 << 10, values_budget=0,
                                max_fds=4 * len(L.spec.fields)
                                + 16 * (len(L.fields) - len(L.spec.fields)))
    for _ in range(40):
        _check_sampled(store.sample(32))
    assert not store.reader.heads
    assert store.reader.tables["obs"].fds.opened > 128
    store.close()


# budgets are split over the scalar fields by row size: step gets 8 of 22 bytes per row
@pytest.mark.parametrize("budget", [1 << 20, 3 * 16 * 22], ids=["all-fit", "three-shards"])
def test_scalar_shards_decoded_by_the_kernel_are_kept_within_the_budget(tmp_path,
                                                                          budget) -> None:
    """Scalars (one chunk per shard): the kernel decodes a missed shard into a value slot,
    later rows of it are served from there; with room for few shards, slots are reused
    and every value is still the general path's."""
    store, rows, steps = _filled(tmp_path)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0,
                         values_budget=budget)
    general = _general(store)
    table = reader.tables["step"]
    assert table.fills == (budget == 1 << 20)
    rng = np.random.default_rng(2)
    for _ in range(30):
        pick = rng.choice(len(rows), 24, replace=False)
        got = reader.read_fields(["step", "action"], rows[pick], steps[pick])
        for name in ("step", "action"):
            expect = np.zeros(24, np.int64)
            assert general.read(name, rows[pick], steps[pick], expect).all()
            values, ok = got[name]
            assert ok.all() and np.array_equal(values, expect)
    assert not reader.heads
    assert (table.owner >= 0).sum() <= table.max_slots
    if budget == 1 << 20:  # everything fits: a second pass opens and decodes nothing
        first = reader.read_fields(["step"], rows, steps)["step"]
        assert first[1].all()
        opened, chunks = table.fds.opened, reader.stats.chunks
        again = reader.read_fields(["step"], rows, steps)["step"]
        assert again[1].all() and np.array_equal(again[0], first[0])
        assert (table.fds.opened, reader.stats.chunks) == (opened, chunks)
    else:  # decoded, room for 3 of 32 shards: the budget holds compressed chunks instead
        assert table.max_slots == 0 and not table.fills
        assert len(table.fds.held) == budget * 8 // 22
    store.close()


def test_rows_of_multi_block_chunks_are_decoded_alone(tmp_path) -> None:
    """Scalars and small vectors read row by row: only the blosc blocks holding the row
    are decoded, bytes gathered from the shuffled planes; rows crossing a block boundary
    (24-byte rows in 32 KiB blocks) and the last, partial block included. Values that
    repeat with periods of 1, 5 and 23 rows give LZ4 matches that overlap their own output
    at every distance the decoder copies differently (1, under 16, at least 16 bytes)."""
    spec = es.Spec.create(obs=es.Field((4, 4), np.uint8),
                          action=es.Field((), np.int64),
                          extras={"vec": es.Field((3,), np.float64),
                                  "small": es.Field((), np.int16),
                                  "few": es.Field((3,), np.uint8),
                                  **{f"period{p}": es.Field((), np.int32)
                                     for p in (1, 5, 23)}})
    store = es.create(tmp_path / "v.zarr", spec, capacity=8192, shard_rows=4096)
    n = 6000
    rng = np.random.default_rng(3)
    vec = rng.normal(size=(n, 3))
    small = rng.integers(-3000, 3000, n).astype(np.int16)
    obs = rng.integers(0, 255, (n + 1, 4, 4)).astype(np.uint8)
    few = rng.integers(0, 4, (n, 3)).astype(np.uint8)  # literals and short matches
    periodic = {"period1": np.repeat(rng.integers(-9, 9, n // 7 + 1), 7)[:n].astype(np.int32),
                **{f"period{p}": np.tile(rng.integers(-2**31, 2**31 - 1, p), n // p + 1)[:n]
                   .astype(np.int32) for p in (5, 23)}}  # (period1: runs of 7 equal values)
    store.extend(dict(obs=obs[:-1], action=np.arange(n), reward=np.zeros(n, np.float32),
                      terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                      next_obs=obs[1:], vec=vec, small=small, few=few, **periodic))
    store.flush()
    rows = np.arange(n)
    steps = store.index.steps(rows)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0,
                         values_budget=0)
    assert not reader.tables["vec"].fills
    pick = rng.permutation(n)
    for name, want in (("vec", vec), ("small", small), ("action", np.arange(n)),
                       ("few", few), *periodic.items()):
        got = reader.read_fields([name], rows[pick], steps[pick])[name]
        assert got[1].all()
        assert np.array_equal(got[0], want[pick]), name
    for i in pick[:300]:  # a row per call: its block decoded after another block's
        got = reader.read_fields(["few"], rows[i:i + 1], steps[i:i + 1])["few"]
        assert got[1].all() and np.array_equal(got[0][0], few[i]), i
    assert not reader.heads
    store.close()


def test_index_entries_and_chunks_of_a_shard_are_read_together(tmp_path) -> None:
    """The rows of one call are read shard by shard, whatever their order: a shard's
    index entries with one read, chunks lying one after another in the file with one
    more. Entries are remembered while the shard stays open (a chunk costs one read
    after that) and never used through another descriptor."""
    store, rows, steps = _filled(tmp_path)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0,
                         max_fds=1024)
    order = np.random.default_rng(0).permutation(len(rows))
    rows, steps = rows[order], steps[order]
    out = np.zeros((len(rows), *FRAME), np.uint8)
    assert reader.read("obs", rows, steps, out).all()
    assert all(np.array_equal(out[i], frame(0, int(s))) for i, s in enumerate(steps))
    fds = reader.tables["obs"].fds
    n_shards = len(np.unique(rows // 16))
    assert reader.stats.requests == 2 * n_shards + fds.opened  # entries, chunks, headers
    before = reader.stats.requests
    again = np.zeros_like(out)
    assert reader.read("obs", rows, steps, again).all()
    assert reader.stats.requests - before == n_shards  # chunks only: entries remembered
    assert np.array_equal(again, out)
    gaps = rows % 2 == 0  # every other chunk: the gaps (< 4 KiB) read too, one read a shard
    before = reader.stats.requests
    assert reader.read("obs", rows[gaps], steps[gaps], again[: int(gaps.sum())]).all()
    assert reader.stats.requests - before == n_shards
    assert np.array_equal(again[: int(gaps.sum())], out[gaps])
    for shard in range(n_shards):  # descriptors closed: entries are read again
        fds.forget(shard)
    before = reader.stats.requests
    assert reader.read("obs", rows[gaps], steps[gaps], again[: int(gaps.sum())]).all()
    assert reader.stats.requests - before == 3 * n_shards  # headers, entries, chunks
    assert np.array_equal(again[: int(gaps.sum())], out[gaps])
    store.close()


@pytest.mark.parametrize("remembered", ["page", "window"])
def test_a_field_of_many_chunks_remembers_only_a_run_s_entries(tmp_path, monkeypatch,
                                                                remembered) -> None:
    """A field of more than four times the chunks its entry cache holds (100M frames
    against 512k entries) remembers, with each index read, the 32 entries from the run's
    chunk rounded down to 16 (a stack and the next frames: still one read for the run),
    not the page's 256; a row far down the same shard then reads its entries again. The
    rows read are the same either way."""
    from expstore.storage.read import fd_table

    if remembered == "window":  # 512 chunks against 64 entries
        monkeypatch.setattr(fd_table, "ENTRY_CACHE_ROWS", 64)
    monkeypatch.setattr(fd_table, "ENTRY_TABLE_BYTES", 0)  # (whole indexes: test_entry_table)
    store, rows, steps = _filled(tmp_path, shard_rows=64)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0,
                         max_fds=1024)
    fds = reader.tables["obs"].fds
    assert len(fds.entries) == (64 if remembered == "window" else 512)
    step_of = dict(zip(rows.tolist(), steps.tolist()))
    last = rows[-1:]  # read first: every version opened after is trusted to the end
    stacks = (np.arange(7)[:, None] * 64 + 3 + np.arange(5)).reshape(-1)
    far = np.array([6 * 64 + 50])  # the last shard whose entries were read
    for batch, reads_per_shard, n_shards in (
            (last, 2, 1), (stacks, 2, 7), (far, 1 if remembered == "page" else 2, 1)):
        want = np.array([step_of[int(r)] for r in batch])
        out = np.zeros((len(batch), *FRAME), np.uint8)
        before, opened = reader.stats.requests, fds.opened
        assert reader.read("obs", batch, want, out).all()
        assert all(np.array_equal(out[i], frame(0, int(s))) for i, s in enumerate(want))
        assert reader.stats.requests - before - (fds.opened - opened) == (
            reads_per_shard * n_shards)
    store.close()


CHILD = r"""
import resource, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from test_batch_path import frame
import expstore as es
from expstore.storage import backend_for
from expstore.storage.read import ShardReader
store = es.open(sys.argv[1])
rows = np.arange(store.capacity)
steps = store.index.steps(rows)
keep = (steps >= 0) & (steps < store.index.count[0])
rows, steps = rows[keep], steps[keep]
soft = 96 + len(__import__("os").listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, soft))  # the hard limit too: no lifting
reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0, max_fds=4000)
out = np.zeros((len(rows), 32, 32), np.uint8)
assert reader.read("obs", rows, steps, out).all()
assert all(np.array_equal(out[i], frame(0, int(s))) for i, s in enumerate(steps))
fds = reader.tables["obs"].fds
print("opened", fds.opened, "held", int((fds.tab[:, fds.FD] >= 0).sum()))
"""


def test_a_process_out_of_descriptors_closes_the_oldest(tmp_path) -> None:
    """A descriptor budget above what the process may open: the kernel closes its oldest
    descriptors and goes on, every row delivered."""
    import subprocess
    import sys

    store, rows, _ = _filled(tmp_path, capacity=4096, shard_rows=16, n=3900)  # 244 shards
    store.close()
    tests = os.path.dirname(__file__)
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "s.zarr"), tests],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    opened, held = (int(x) for x in out.stdout.split()[1::2])
    assert opened >= len(np.unique(rows // 16)) and held < opened  # older ones closed


def test_closing_a_store_gives_its_descriptor_share_back(tmp_path) -> None:
    """A reader's share of the process's descriptor budget comes back when its store is
    closed, not only when the reader is collected: a process that opened and closed many
    stores (a notebook, a test suite) still gives a new reader its full share."""
    from expstore.storage.read import kernel_budget as reader_mod

    store, rows, steps = _filled(tmp_path)
    before = reader_mod._fds_taken[0]
    other = es.open(store.url)
    out = np.zeros((32, *FRAME), np.uint8)
    assert other.source.read("obs", rows[:32], steps[:32], out).all()
    taken = reader_mod._fds_taken[0] - before
    assert taken > 0  # its reader took a share
    keep = other  # (still referenced: only close() can give the share back)
    keep.close()
    assert reader_mod._fds_taken[0] == before
    store.close()


TWO_STORES = r"""
import resource, sys
import numpy as np
sys.path.insert(0, sys.argv[3])
import expstore as es
from expstore.storage.read import kernel_budget
resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))  # the hard limit too: no lifting
small = es.open(sys.argv[1])
small.sample(64)
small_took = kernel_budget._fds_taken[0]
big = es.open(sys.argv[2])
rows = np.arange(big.capacity)
steps = big.index.steps(rows)
keep = (steps >= 0) & (steps < big.index.count[0])
rows, steps = rows[keep], steps[keep]
fds = big.reader.tables["obs"].fds
out = np.zeros((len(rows), 32, 32), np.uint8)
assert big.source.read("obs", rows, steps, out).all()
first = fds.opened
assert big.source.read("obs", rows, steps, out).all()
print(small_took, len(small.layout.fields), fds.ring.size, first, fds.opened - first)
"""


def test_a_small_store_opened_first_leaves_a_large_one_its_descriptors(tmp_path) -> None:
    """A reader takes no more of the process's descriptor budget than its store's shards
    can use (``kernel_shares``: no field more than its shards): a small store opened first
    once took half of what the process had left, and a 100M-row store opened after it in
    the same process reopened 13 frame shards per batch of 32 (30x its batch cost), or,
    with two small stores opened first, 46 per batch of 256. Here, under 8,192 descriptors,
    a 32-shard store opened and sampled first, then every row of a 1,024-shard store read
    twice: the second pass opens no shard."""
    import subprocess
    import sys

    if resource_hard_limit() < 8192:
        pytest.skip("the hard descriptor limit is below the 8,192 this test sets")
    small = make_store(tmp_path / "small.zarr", capacity=512, shard_rows=16)
    write(small, 0, 0, 500)
    small.close()
    spec = es.Spec.create(obs=es.Field(FRAME, np.uint8, stack=4), action=es.Field((), np.int64),
                          extras={"step": es.Field((), np.int64)})
    big = es.create(tmp_path / "big.zarr", spec, capacity=16384, shard_rows=16, fsync=False)
    write(big, 0, 0, 16000)  # (episode ends take a row each: the ring wraps)
    big.close()
    out = subprocess.run([sys.executable, "-c", TWO_STORES, str(tmp_path / "small.zarr"),
                          str(tmp_path / "big.zarr"), os.path.dirname(__file__)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    small_took, fields, held, first, again = (int(x) for x in out.stdout.split())
    assert small_took <= max(256, 32 * fields)  # its shards' worth, not half (1,536 here)
    assert held == 1024  # every shard of the large store's frames held open
    assert first >= 1024 and again == 0


def resource_hard_limit() -> int:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1 << 30 if hard == resource.RLIM_INFINITY else hard
