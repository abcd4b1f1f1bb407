"""The frame path's reads issued concurrently (``storage/native/read_pool.h``).

``read_rows`` records a batch's chunk runs and reads them through a per-process pool of
threads, ``EXPSTORE_READ_DEPTH`` preads in flight; depth 1 reads one run after another as
before. These tests read real stores on disk and hold every depth to depth 1's bytes,
counts and errors, across a fork and through real DataLoader workers.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from test_batch_path import FRAME, _committed, check_batch, frame, make_store, write

import expstore as es
from expstore.storage import backend_for
from expstore.storage.native import READ_DEPTH_ENV, set_read_depth
from expstore.storage.native.kernels import native
from expstore.storage.read import ShardReader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.baselines import drop_page_cache, warm_page_cache  # noqa: E402

if native is None and os.environ.get("EXPSTORE_REQUIRE_NATIVE"):
    raise RuntimeError("expstore.storage.native._kernels was not built (EXPSTORE_REQUIRE_NATIVE=1)")
pytestmark = pytest.mark.skipif(native is None, reason="C kernel not built")


@pytest.fixture(autouse=True)
def _restore_depth(monkeypatch):
    monkeypatch.delenv(READ_DEPTH_ENV, raising=False)
    before = native.read_depth()
    yield
    native.set_read_depth(before)


def _store(tmp_path, capacity=1024, shard_rows=32, n=960):
    store = make_store(tmp_path / "s.zarr", capacity=capacity, shard_rows=shard_rows)
    write(store, 0, 0, n)
    store.flush()
    rows, steps, _ = _committed(store)
    keep = (steps >= 0) & (steps < store.index.count[0])
    assert np.array_equal(rows[keep], steps[keep])  # not wrapped: neighbouring rows
    return store, rows[keep], steps[keep]


def _evict(store) -> None:
    """Drop the store's pages from the page cache (written back first): its next reads
    are disk reads, which the pool takes (pages still cached are read by the caller)."""
    drop_page_cache(store.url.removeprefix("file://"), sync=True)


def _cache(store) -> None:
    """Read every file of the store once, so that its pages are in the page cache."""
    warm_page_cache(store.url.removeprefix("file://"))


def _kernel_reads(store, rows, steps, depth, batches=30, cold=True, **kw):
    """Seeded batches of stacks (4 frames and the next: neighbouring rows, random
    anchors) read by a fresh reader at ``depth`` (``cold``: the store's pages dropped
    before each batch): the frames and the reader's counters. (A reader maps nothing
    unless ``map_bytes`` says so: pages a process has mapped are not dropped by
    ``posix_fadvise(DONTNEED)``, so its reads would not be cold.)"""
    set_read_depth(depth)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0, **kw)
    rng = np.random.default_rng(7)
    got = []
    for _ in range(batches):
        if cold:
            _evict(store)
        anchors = rng.choice(len(rows) - 5, 32, replace=False)
        pick = (anchors[:, None] + np.arange(5)).reshape(-1)
        out = np.zeros((len(pick), *FRAME), np.uint8)
        assert reader.read("obs", rows[pick], steps[pick], out).all()
        for i, s in zip(pick[::7], steps[pick][::7]):
            assert np.array_equal(out[list(pick).index(i)], frame(0, int(s)))
        got.append(out)
    stats = (reader.stats.requests, reader.stats.bytes, reader.stats.chunks)
    assert not reader.heads  # every frame came from the kernel
    reader.close()
    return np.stack(got), stats


@pytest.mark.parametrize("depth", [2, 8, 64])
def test_reads_through_the_pool_match_depth_one(tmp_path, depth) -> None:
    store, rows, steps = _store(tmp_path)
    one, one_stats = _kernel_reads(store, rows, steps, 1)
    assert native.read_depth() == 1
    many, many_stats = _kernel_reads(store, rows, steps, depth)
    assert np.array_equal(one, many)
    assert one_stats == many_stats  # the same reads (a stack and its next frame: one)
    assert native.read_pool_threads() >= depth - 1  # the pool did the reads
    store.close()


def test_pool_reads_with_fewer_descriptors_than_shards_match_depth_one(tmp_path) -> None:
    """Shards opened mid-batch close older descriptors: runs recorded before an open are
    read first, so none reads through a descriptor closed (or reused) under it."""
    store, rows, steps = _store(tmp_path, capacity=2048, shard_rows=16, n=1900)
    L = store.layout
    fds = 4 * len(L.spec.fields) + 16 * (len(L.fields) - len(L.spec.fields))
    one, one_stats = _kernel_reads(store, rows, steps, 1, batches=12, max_fds=fds)
    many, many_stats = _kernel_reads(store, rows, steps, 16, batches=12, max_fds=fds)
    assert np.array_equal(one, many)
    assert one_stats == many_stats
    store.close()


def test_sampled_batches_match_depth_one(tmp_path) -> None:
    store, _, _ = _store(tmp_path)
    batches = {}
    for depth in (1, 16):
        set_read_depth(depth)
        reader = es.open(tmp_path / "s.zarr", cache_bytes=0)
        sampler = es.UniformSampler(reader, seed=3)
        batches[depth] = []
        for _ in range(10):
            _evict(store)
            batches[depth].append(sampler.sample(32))
        reader.close()
    for a, b in zip(batches[1], batches[16]):
        for k in ("obs", "next_obs", "action", "step_id"):
            assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k
    store.close()


def _flip_last_chunk(store, tmp_path, shard: int) -> str:
    key = store.layout.shard_key("obs", shard)
    path = tmp_path / "s.zarr" / key
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # a bit flip in the shard's last chunk
    path.write_bytes(bytes(data))
    return key


def test_a_damaged_chunk_gives_the_same_error_at_any_depth(tmp_path) -> None:
    store, rows, steps = _store(tmp_path, capacity=128, shard_rows=16, n=110)
    key = _flip_last_chunk(store, tmp_path, 2)
    pick = np.arange(16, 64)  # shards 1-3: the damaged chunk among good ones
    errors = []
    for depth in (1, 8):
        set_read_depth(depth)
        reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0)
        out = np.zeros((len(pick), *FRAME), np.uint8)
        _evict(store)  # (disk reads: through the pool at depth 8)
        with pytest.raises(es.StoreCorruptError, match=key.replace("/", ".")) as err:
            reader.read("obs", rows[pick], steps[pick], out)
        errors.append(str(err.value))
        good = rows[pick] // 16 != 2  # the other shards still read
        out = np.zeros((int(good.sum()), *FRAME), np.uint8)
        assert reader.read("obs", rows[pick][good], steps[pick][good], out).all()
        reader.close()
    assert errors[0] == errors[1]
    store.close()


def test_a_forked_child_starts_its_own_pool(tmp_path) -> None:
    """The parent's pool threads do not exist in a child; the child starts its own and
    reads the same bytes, warm and cold."""
    store, rows, steps = _store(tmp_path)
    expect, _ = _kernel_reads(store, rows, steps, 8)
    assert native.read_pool_threads() >= 7
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it saw, then leave without cleanup
        try:
            before = native.read_pool_threads()
            _cache(store)  # (the parent's cold reads left most pages out of the cache)
            warm, _ = _kernel_reads(store, rows, steps, 8, cold=False)
            after_warm = native.read_pool_threads()
            got, _ = _kernel_reads(store, rows, steps, 8)
            msg = pickle.dumps((before, after_warm, native.read_pool_threads(),
                                bool(np.array_equal(got, expect)),
                                bool(np.array_equal(warm, expect))))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            msg = pickle.dumps(repr(e))
        os.write(write_end, msg)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        report = pickle.loads(f.read())
    os.waitpid(pid, 0)
    assert not isinstance(report, str), report
    before, _, after_cold, cold_same, warm_same = report
    # (the warm batch usually wakes no thread, but RWF_NOWAIT may refuse a cached page that
    # carries a readahead mark, and that run then goes to the pool: not asserted)
    assert (before, after_cold, cold_same, warm_same) == (0, 7, True, True)
    store.close()


def test_loader_workers_forked_after_the_pool_started_read_correct_batches(tmp_path) -> None:
    store, rows, steps = _store(tmp_path)
    _kernel_reads(store, rows, steps, 8, batches=2)  # the pool runs in this process
    assert native.read_pool_threads() >= 7
    loader = es.make_loader(store, batch_size=32, num_workers=2, prefetch_factor=2,
                            multiprocessing_context="fork", num_batches=40)
    n = 0
    for batch in loader:
        check_batch(batch)
        n += 1
    assert n == 40
    assert loader.stats.requests > 0
    loader.close()
    store.close()


@pytest.mark.parametrize("bad", ["0", "-3", "257", "four", "2.5"])
def test_a_bad_depth_in_the_environment_is_named(tmp_path, monkeypatch, bad) -> None:
    store, _, _ = _store(tmp_path, capacity=64, shard_rows=16, n=50)
    monkeypatch.setenv(READ_DEPTH_ENV, bad)
    with pytest.raises(ValueError, match=f"{READ_DEPTH_ENV}: expected an integer from 1 to 256"):
        ShardReader(backend_for(store.url), store.layout)
    store.close()


def test_the_depth_in_the_environment_is_applied(tmp_path, monkeypatch) -> None:
    store, _, _ = _store(tmp_path, capacity=64, shard_rows=16, n=50)
    set_read_depth(1)
    monkeypatch.setenv(READ_DEPTH_ENV, "12")
    ShardReader(backend_for(store.url), store.layout).close()
    assert native.read_depth() == 12
    store.close()


@pytest.mark.parametrize("bad", [0, 257, True, 2.0, "4"])
def test_set_read_depth_checks_its_argument(bad) -> None:
    with pytest.raises(ValueError, match="read depth: expected an integer from 1 to 256"):
        set_read_depth(bad)
    with pytest.raises((ValueError, TypeError)):
        native.set_read_depth(bad if not isinstance(bad, (bool, str, float)) else 0)


def test_a_cold_stack_costs_one_read_once_its_index_page_was_read(tmp_path) -> None:
    """Reading one row's index entry remembers its whole 4 KiB page of entries: a later
    stack of the page (4 frames and the next, one run) costs one read, and a stack whose
    middle frame is not asked for (held by the caller's frame cache) one read too."""
    store, rows, steps = _store(tmp_path, capacity=1024, shard_rows=512, n=960)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0)
    out = np.zeros((5, *FRAME), np.uint8)
    first = np.array([0, 510])  # (510: the shard is trusted up to its step from here on)
    assert reader.read("obs", rows[first], steps[first], out[:2]).all()
    assert reader.stats.requests == 5  # header; per row: its entries' page, its chunk
    for anchor, pick in ((100, [0, 1, 2, 3, 4]), (300, [0, 1, 3, 4]), (500, [0, 4])):
        sel = anchor + np.array(pick)
        before = reader.stats.requests
        assert reader.read("obs", rows[sel], steps[sel], out[: len(sel)]).all()
        assert reader.stats.requests - before == 1, (anchor, pick)
        for k, s in enumerate(steps[sel]):
            assert np.array_equal(out[k], frame(0, int(s)))
    reader.close()
    store.close()


def test_threads_of_one_process_share_the_pool(tmp_path) -> None:
    """Readers in several threads submit batches to the one pool at once: each gets its
    own rows, the same as depth 1 read alone."""
    from concurrent.futures import ThreadPoolExecutor

    store, rows, steps = _store(tmp_path)
    expect, _ = _kernel_reads(store, rows, steps, 1)
    set_read_depth(4)
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda _: _kernel_reads(store, rows, steps, 4)[0], range(4)))
    for g in got:
        assert np.array_equal(g, expect)
    store.close()
