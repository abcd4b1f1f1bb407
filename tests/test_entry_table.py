"""Whole shards' index entries held by the C kernel for frame fields of many chunks
(``shard_reads.h``, ``FdTable.entry_blocks``): a frame then costs one read (its run), not
two (its index entries first).

Real stores written by ``Store.add``; every batch is compared with the general path
(numcodecs, parsed indexes). The fields here have 1,024 chunks, made "many" by an entry
cache of 64 (``ENTRY_CACHE_ROWS``; a 100M-frame store has 100M chunks against 512k).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_batch_path import FRAME, frame, make_store, write

import expstore as es
from expstore.storage import backend_for
from expstore.storage.native import set_read_depth
from expstore.storage.native.kernels import native
from expstore.storage.read import ShardReader, fd_table

pytestmark = pytest.mark.skipif(native is None, reason="C kernel not built")

SHARD_ROWS = 64
#: bytes the table gives one shard's entries: a cache line per ENTRY_BLOCK chunks (3 here)
SLOT_BYTES = -(-SHARD_ROWS // fd_table.ENTRY_BLOCK) * fd_table.ENTRY_BLOCK_BYTES


@pytest.fixture
def many_chunks(monkeypatch):
    monkeypatch.setattr(fd_table, "ENTRY_CACHE_ROWS", 64)


@pytest.fixture(params=[1, 16], ids=["depth1", "depth16"])
def depth(request):
    """Runs read at once (depth 1) or deferred to the read pool (read_pool.h)."""
    before = set_read_depth(request.param)
    yield request.param
    set_read_depth(before)


def _stored(store):
    """Rows and steps the store holds (a new lap drops its shard's old rows at once)."""
    rows = np.arange(store.capacity)
    steps = store.index.steps(rows)
    keep = (steps >= store.index.valid_from[0]) & (steps < store.index.count[0])
    return rows[keep], steps[keep]


def _filled(path, n=980, capacity=1024):
    store = make_store(path, capacity=capacity, shard_rows=SHARD_ROWS)
    write(store, 0, 0, n)
    store.flush()
    return (store, *_stored(store))


def _reader(store) -> ShardReader:
    return ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0, max_fds=1024)


def _read(reader, rows, steps) -> np.ndarray:
    out = np.zeros((len(rows), *FRAME), np.uint8)
    assert reader.read("obs", rows, steps, out).all()
    return out


def _expected(steps) -> np.ndarray:
    return np.stack([frame(0, int(s)) for s in steps])


def test_a_complete_shard_is_read_with_one_read_per_run(tmp_path, many_chunks, depth) -> None:
    store, rows, steps = _filled(tmp_path / "s.zarr")
    reader = _reader(store)
    fds = reader.tables["obs"].fds
    assert len(fds.entry_blocks) == 16 and len(fds.entry_of) == 16  # every shard fits
    step_of = dict(zip(rows.tolist(), steps.tolist()))
    last = rows[-1:]  # read first: every version opened after is trusted to the end
    _read(reader, last, steps[-1:])
    # a stack and its next frame in each of 7 complete shards: a header, the whole index,
    # then one read for the run
    stacks = (np.arange(7)[:, None] * SHARD_ROWS + 3 + np.arange(5)).reshape(-1)
    want = np.array([step_of[int(r)] for r in stacks])
    before = reader.stats.requests
    assert np.array_equal(_read(reader, stacks, want), _expected(want))
    assert reader.stats.requests - before == 3 * 7
    assert (fds.entry_of[:7, 0] >= 0).all()  # loaded, each with a slot
    # rows anywhere in those shards: one read each, no index read
    far = np.arange(7) * SHARD_ROWS + 50
    want = np.array([step_of[int(r)] for r in far])
    before = reader.stats.requests
    assert np.array_equal(_read(reader, far, want), _expected(want))
    assert reader.stats.requests - before == 7
    reader.close()
    store.close()


def test_batches_equal_the_general_path_and_the_entry_cache_s(tmp_path, many_chunks,
                                                             depth) -> None:
    store, rows, steps = _filled(tmp_path / "s.zarr")
    held, general = _reader(store), ShardReader(backend_for(store.url), store.layout,
                                                row_cache_bytes=0)
    general.tables = {}
    rng = np.random.default_rng(1)
    for _ in range(30):
        pick = np.sort(rng.choice(len(rows), 64, replace=False))
        got = _read(held, rows[pick], steps[pick])
        expect = np.zeros_like(got)
        assert general.read("obs", rows[pick], steps[pick], expect).all()
        assert np.array_equal(got, expect)
        assert np.array_equal(got, _expected(steps[pick]))
    # (the last shard, partly written, is never loaded: its entries come the old way)
    assert (held.tables["obs"].fds.entry_of[:, 0] >= 0).sum() == 15
    held.close()
    general.close()
    store.close()


def test_a_run_across_a_block_boundary_is_one_read(tmp_path, many_chunks, depth) -> None:
    """Held entries come in cache-line blocks of ENTRY_BLOCK chunks (its first offset and
    each size): a stack whose frames straddle two blocks, and the last, partial block of
    a shard, read right and with one read per run."""
    store, rows, steps = _filled(tmp_path / "s.zarr")
    reader = _reader(store)
    fds = reader.tables["obs"].fds
    assert fds.entry_blocks.ctypes.data % fd_table.ENTRY_BLOCK_BYTES == 0
    assert fds.entry_blocks.shape[1] == SLOT_BYTES == 3 * 64  # 64 chunks: 28 + 28 + 8
    step_of = dict(zip(rows.tolist(), steps.tolist()))
    _read(reader, rows[-1:], steps[-1:])  # (every version opened after is trusted)
    b = fd_table.ENTRY_BLOCK
    for first in (b - 2, 2 * b - 1, SHARD_ROWS - 5):  # 26-30, 55-59, 59-63
        stack = 4 * SHARD_ROWS + first + np.arange(5)
        want = np.array([step_of[int(r)] for r in stack])
        _read(reader, stack[:1], want[:1])  # the shard's index loaded
        before = reader.stats.requests
        assert np.array_equal(_read(reader, stack, want), _expected(want))
        assert reader.stats.requests - before == 1, first
    reader.close()
    store.close()


def test_entry_blocks_must_be_aligned_to_a_cache_line() -> None:
    good = fd_table.aligned_zeros(3, 128, 64)
    assert good.shape == (3, 128) and good.ctypes.data % 64 == 0 and not good.any()
    assert fd_table.aligned_zeros(0, 128, 64).shape == (0, 128)
    buf = fd_table.aligned_zeros(1, SLOT_BYTES + 64, 64)[0]  # (room to start 1 byte on)
    args = (b"p", b"s", SHARD_ROWS, 1, 1, 16, True, np.zeros(1, np.int64),
            np.full((4, fd_table.TAB_COLS), -1, np.int64), np.zeros(8, np.int64),
            np.zeros(fd_table.STATE_LEN, np.int64),
            np.full((4, fd_table.ECACHE_COLS), -1, np.int64), None, None, None)
    rest = (np.full((4, fd_table.ENTRY_OF_COLS), -1, np.int64), np.zeros(1, np.int64))
    native.ReadState(*args, buf[:SLOT_BYTES], *rest)
    with pytest.raises(ValueError, match="entry_blocks 64-byte aligned"):
        native.ReadState(*args, buf[1:1 + SLOT_BYTES], *rest)


def test_shards_past_the_budget_are_read_the_old_way(tmp_path, many_chunks,
                                                     monkeypatch) -> None:
    monkeypatch.setattr(fd_table, "ENTRY_TABLE_BYTES", 3 * SLOT_BYTES)
    store, rows, steps = _filled(tmp_path / "s.zarr")
    reader = _reader(store)
    fds = reader.tables["obs"].fds
    assert len(fds.entry_blocks) == 3
    for _ in range(2):  # the second time: the 3 shards loaded first keep their slots
        assert np.array_equal(_read(reader, rows, steps), _expected(steps))
    assert (fds.entry_of[:, 0] >= 0).sum() == 3
    assert fds.entry_state[0] == 3
    reader.close()
    store.close()


def test_open_entry_bytes_sets_the_budget_and_batches_stay_the_same(tmp_path,
                                                                     many_chunks) -> None:
    """``open(entry_bytes=...)``: how many shards' offsets the store's reader holds (0:
    none, every frame's offset read first); DataLoader workers are given the store's. The
    rows read are the same whatever the budget."""
    store, rows, steps = _filled(tmp_path / "s.zarr")
    store.close()
    got = {}
    for budget, slots in ((None, 16), (0, 0), (5 * SLOT_BYTES + 7, 5)):
        s = es.open(tmp_path / "s.zarr", entry_bytes=budget)
        assert s.entry_bytes == (fd_table.ENTRY_TABLE_BYTES if budget is None else budget)
        fds = s.reader.tables["obs"].fds
        assert len(fds.entry_blocks) == slots
        got[budget] = _read(s.reader, rows, steps)
        assert (fds.entry_of[:, 0] >= 0).sum() == min(slots, 15)  # (15 complete shards)
        loader = es.make_loader(s, batch_size=8, num_workers=0)
        assert loader.dataset.entry_bytes == s.entry_bytes
        s.close()
    for budget in got:
        assert np.array_equal(got[budget], _expected(steps))
    with pytest.raises(ValueError, match=r"entry_bytes: expected an int >= 0 \(bytes\)"):
        es.open(tmp_path / "s.zarr", entry_bytes=-1)


def test_a_damaged_index_is_not_held_and_its_rows_still_read(tmp_path, many_chunks) -> None:
    """A flipped byte in one chunk's entry fails the index's crc32c: that shard is not
    held; its other rows are read through their own entries, the damaged row is refused."""
    store, rows, steps = _filled(tmp_path / "s.zarr")
    path = os.path.join(store.url.removeprefix("file://"),
                        store.layout.shard_key("obs", 2))
    with open(path, "r+b") as f:
        f.seek(16 * 10 + 8)  # the size of chunk 10
        b = f.read(1)
        f.seek(16 * 10 + 8)
        f.write(bytes([b[0] ^ 0x40]))
    reader = _reader(store)
    in2 = (rows // SHARD_ROWS == 2) & (rows % SHARD_ROWS != 10)
    assert np.array_equal(_read(reader, rows[in2], steps[in2]), _expected(steps[in2]))
    fds = reader.tables["obs"].fds
    assert fds.entry_of[2, 0] == -1 and fds.entry_of[2, 2] >= 0  # tried, not held
    out = np.zeros((1, *FRAME), np.uint8)
    bad = rows == 2 * SHARD_ROWS + 10
    assert not fds.read(rows[bad] // SHARD_ROWS, rows[bad] % SHARD_ROWS, steps[bad],
                        np.zeros(1, np.int64), out.reshape(1, -1), reader.stats)[0].any()
    reader.close()
    store.close()


def test_a_shard_written_again_is_loaded_again(tmp_path, many_chunks, depth) -> None:
    """The ring wraps: a shard's next lap is a new version, opened and loaded again into
    the slot it had; its rows are the new lap's."""
    store, rows, steps = _filled(tmp_path / "s.zarr", n=980, capacity=1024)
    reader = _reader(store)
    fds = reader.tables["obs"].fds
    assert np.array_equal(_read(reader, rows, steps), _expected(steps))
    slots = fds.entry_of[:, 0].copy()
    write(store, 0, 980, 400)  # past the capacity: shards 0-5 hold a new lap
    store.flush()
    reader.known[:] = store.index.count
    rows, steps = _stored(store)
    assert steps.max() > 1024
    assert np.array_equal(_read(reader, rows, steps), _expected(steps))
    again = fds.entry_of[:, 0]
    assert np.array_equal(again[slots >= 0], slots[slots >= 0])  # the same slots
    assert fds.entry_state[0] == (again >= 0).sum()
    reader.close()
    store.close()


CHILD = r"""
import os, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
import expstore as es
from test_batch_path import frame
first = es.open(sys.argv[1])  # (imports done while this process may read them)
first.sample(8)
first.close()
os.setgid(65534)
os.setuid(65534)  # nobody: not the files' owner, so O_NOATIME is refused (EPERM)
store = es.open(sys.argv[1])
rows = np.arange(64, 512)
steps = store.index.steps(rows)
got = np.zeros((len(rows), 32, 32), np.uint8)
assert store.reader.read("obs", rows, steps, got).all()
assert all(np.array_equal(got[i], frame(0, int(s))) for i, s in enumerate(steps))
assert store.reader.tables["obs"].fds.opened > 0  # (through the kernel)
batch = store.sample(32)
print("ok", len(batch["obs"]))
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="needs root to run a reader as another user")
def test_a_reader_that_does_not_own_the_files_reads_them(tmp_path) -> None:
    """The kernel opens shards without access-time updates where it may; a process that
    does not own the files (O_NOATIME refused) opens them the plain way."""
    import subprocess
    import sys
    import tempfile

    folder = tempfile.mkdtemp(dir="/tmp")  # (pytest's own folders are the owner's alone)
    try:
        os.chmod(folder, 0o755)
        store, _, _ = _filled(os.path.join(folder, "s.zarr"), n=500, capacity=512)
        store.close()
        for dirpath, dirs, files in os.walk(folder):
            for d in dirs:
                os.chmod(os.path.join(dirpath, d), 0o755)
            for f in files:
                os.chmod(os.path.join(dirpath, f), 0o644)
        here = os.path.dirname(__file__)
        out = subprocess.run([sys.executable, "-c", CHILD, os.path.join(folder, "s.zarr"),
                              here], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip().endswith("ok 32")
    finally:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("seconds", [3.0, pytest.param(45.0, marks=pytest.mark.slow)])
def test_frames_are_read_beside_a_thread_that_adds_and_forgets_shards(tmp_path, monkeypatch,
                                                                      seconds):
    """The same race on one row per chunk (the frame path of the kernel) with whole shards'
    indexes held (``fd_table.ENTRY_CACHE_ROWS`` made small), the GIL handed every 10 us
    throughout: the actor's writer forgets each shard it writes (closing the reader's
    descriptor) while the learner's kernel call, without the GIL, may be closing or
    reopening that descriptor. Before ``FdTable`` held a lock over both, the actor got
    EBADF (a descriptor closed twice, or another's closed) once in ~225 s of such runs
    here: this catches it now and then; the test below checks the lock itself."""
    from expstore.testing.thread_race import race

    monkeypatch.setattr(fd_table, "ENTRY_CACHE_ROWS", 64)  # 256 chunks: the table is used
    batches, added, wrong = race(str(tmp_path / "s.zarr"), seconds, 5, 1, 0.0)
    assert wrong == [] and batches > 100
    assert added > 8 * 256


def test_forget_waits_for_a_kernel_call_on_the_same_table(tmp_path, many_chunks) -> None:
    """``FdTable.forget`` (another thread's writer forgetting a shard it wrote) takes the
    lock each kernel call holds, so it never closes a descriptor the kernel is using."""
    import threading

    store, rows, steps = _filled(tmp_path / "s.zarr")
    reader = _reader(store)
    fds = reader.tables["obs"].fds
    _read(reader, rows[:8], steps[:8])
    assert fds.tab[0, fds.FD] >= 0
    done = threading.Event()
    with fds._lock:  # (as a kernel call in flight holds it)
        t = threading.Thread(target=lambda: (fds.forget(0), done.set()))
        t.start()
        assert not done.wait(0.3)  # waits
        assert fds.tab[0, fds.FD] >= 0
    assert done.wait(10)
    t.join()
    assert fds.tab[0, fds.FD] == -1
    assert np.array_equal(_read(reader, rows[:8], steps[:8]), _expected(steps[:8]))
    reader.close()
    store.close()
