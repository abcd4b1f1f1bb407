"""Frame shards read through memory mappings (``shard_maps.h``, ``open(map_bytes=...)``):
the same rows as ``pread`` gives, within the budget, never outliving the descriptor, and a
SIGBUS on a mapped page (a file truncated under the reader) failing the read, not the
process.

Real stores written by ``Store.add``; frames compared with what was written.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import expstore as es
from expstore.storage import backend_for
from expstore.storage.native import set_read_depth
from expstore.storage.native.kernels import native
from expstore.storage.read import ShardReader
from expstore.storage.read.fd_table import MAP_BYTES, ST_MAP_BUDGET

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.baselines import drop_files  # noqa: E402
from benchmarks.page_cache import resident_pages  # noqa: E402

pytestmark = pytest.mark.skipif(native is None, reason="C kernel not built")

SHARD_ROWS = 64


@pytest.fixture(params=[1, 16], ids=["depth1", "depth16"])
def depth(request):
    """Runs read at once (depth 1) or deferred to the read pool (read_pool.h)."""
    before = set_read_depth(request.param)
    yield request.param
    set_read_depth(before)


NOISE = (64, 64)  # 4 KiB of noise a frame: every frame its own run when rows skip one


def _noise(step: int) -> np.ndarray:
    return np.random.default_rng(step).integers(0, 256, NOISE, dtype=np.uint8)


def _filled(path, n=980, capacity=1024):
    spec = es.Spec.create(obs=es.Field(NOISE, np.uint8), action=es.Field((), np.int64))
    store = es.create(path, spec, capacity=capacity, shard_rows=SHARD_ROWS)
    assert store.layout.chunk_rows("obs") == 1
    for t in range(n):
        store.add(_noise(t), t % 5, 0.0, _noise(t + 1), False, False)
    store.flush()
    rows = np.arange(store.capacity)
    steps = store.index.steps(rows)
    keep = (steps >= store.index.valid_from[0]) & (steps < store.index.count[0])
    return store, rows[keep], steps[keep]


def _reader(store, **kw) -> ShardReader:
    """A reader holding every shard open (unless ``max_fds`` says otherwise: by default the
    budget is what the process may still open, less under a loaded test run)."""
    kw.setdefault("max_fds", 1024)
    kw.setdefault("map_bytes", MAP_BYTES)
    return ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0, **kw)


def _read(reader, rows, steps) -> np.ndarray:
    out = np.zeros((len(rows), *NOISE), np.uint8)
    assert reader.read("obs", rows, steps, out).all()
    return out


def _expected(steps) -> np.ndarray:
    return np.stack([_noise(int(s)) for s in steps])


def _shard_files(store) -> list[str]:
    n_shards = store.layout.capacity // store.layout.shard_rows
    return [os.path.join(store.backend.root, store.layout.shard_key("obs", s))
            for s in range(n_shards)]


def _mappings_of(folder: str) -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if folder in line]


def _spread(rows, steps, n, seed=0):
    """n rows, no two next to each other: one run each."""
    apart = np.flatnonzero(rows % 2 == 0)
    pick = np.random.default_rng(seed).choice(apart, n, replace=False)
    return rows[pick], steps[pick]


def test_mapped_reads_give_the_rows_preads_give(tmp_path, depth) -> None:
    store, rows, steps = _filled(tmp_path / "s.zarr")
    mapped, plain = _reader(store), _reader(store, map_bytes=0)
    a, s = _spread(rows, steps, 400)
    for _ in range(3):  # (the deferred path maps once 64 runs in a row were warm)
        got_mapped, got_plain = _read(mapped, a, s), _read(plain, a, s)
        np.testing.assert_array_equal(got_mapped, _expected(s))
        np.testing.assert_array_equal(got_plain, got_mapped)
    fds_mapped, fds_plain = mapped.tables["obs"].fds, plain.tables["obs"].fds
    assert fds_mapped.mapped_reads == 3 * 400  # (every run: its pages are in the cache)
    assert fds_mapped.mapped_bytes == sum(os.path.getsize(p) for p in _shard_files(store))
    assert fds_plain.mapped_reads == 0 and fds_plain.mapped_bytes == 0
    mapped.close(), plain.close(), store.close()


@pytest.mark.parametrize("depth", [1], indirect=True)  # (counts what one read does)
def test_the_budget_bounds_what_is_mapped(tmp_path, depth) -> None:
    store, rows, steps = _filled(tmp_path / "s.zarr")
    sizes = [os.path.getsize(p) for p in _shard_files(store)]
    budget = 3 * max(sizes)
    reader = _reader(store, map_bytes=budget)
    a, s = _spread(rows, steps, 400)
    np.testing.assert_array_equal(_read(reader, a, s), _expected(s))
    fds = reader.tables["obs"].fds
    held = fds.tab[fds.tab[:, fds.MAP_AT] > 0]
    assert 3 <= len(held) < len(sizes)  # some shards mapped, the rest read with pread
    assert fds.mapped_bytes == held[:, fds.MAP_LEN].sum() <= budget
    assert 0 < fds.mapped_reads < 400
    assert fds.mapped_reads == np.isin(a // SHARD_ROWS, np.flatnonzero(
        fds.tab[:, fds.MAP_AT] > 0)).sum()  # every run of a mapped shard
    reader.close(), store.close()


@pytest.mark.parametrize("depth", [1], indirect=True)  # (counts what one read does)
def test_a_mapping_goes_with_its_descriptor(tmp_path, depth) -> None:
    store, rows, steps = _filled(tmp_path / "s.zarr")
    folder = os.path.join(store.backend.root, "obs", "c")
    reader = _reader(store, max_fds=32)  # obs gets some of them: the ring closes the oldest
    a, s = _spread(rows, steps, 400)
    np.testing.assert_array_equal(_read(reader, a, s), _expected(s))
    fds = reader.tables["obs"].fds
    open_now = fds.tab[:, fds.FD] >= 0
    assert ((fds.tab[:, fds.MAP_AT] > 0) <= open_now).all()  # none without its fd
    assert 0 < len(_mappings_of(folder)) <= open_now.sum() < 16  # some were closed
    shard = int(np.flatnonzero(fds.tab[:, fds.MAP_AT] > 0)[0])
    size = int(fds.tab[shard, fds.MAP_LEN])
    mapped = fds.mapped_bytes
    fds.forget(shard)
    assert fds.tab[shard, fds.MAP_AT] == 0 and fds.mapped_bytes == mapped - size
    reader.close()
    assert _mappings_of(folder) == [] and fds.mapped_bytes == 0
    store.close()


def _drop_pages(paths: list[str]) -> None:
    """Every page of ``paths`` out of the page cache (a page still on a CPU's LRU batch is
    not dropped at the first try), or skip where this file system keeps them."""
    for _ in range(50):
        drop_files(paths, sync=True)
        if sum(resident_pages(p)[0] for p in paths) == 0:
            return
        time.sleep(0.02)
    pytest.skip("pages of this file system cannot be dropped from the cache")


@pytest.mark.parametrize("depth", [16], indirect=True)
def test_the_read_pool_reads_runs_not_in_the_page_cache(tmp_path, depth) -> None:
    """At read depth > 1 a run is copied from its mapping only when its pages are in the
    page cache (``mincore``): a mapped page that is not would be read from the disk by the
    caller alone, where the pool reads many at once."""
    store, rows, steps = _filled(tmp_path / "s.zarr")
    a, s = _spread(rows, steps, 400)
    reader = _reader(store, map_bytes=0)
    fds = reader.tables["obs"].fds
    # every shard opened and its index entries remembered (nothing mapped), then every
    # page dropped: the batch below reads nothing but its runs
    first = np.unique(a // SHARD_ROWS, return_index=True)[1]
    np.testing.assert_array_equal(_read(reader, a[first], s[first]), _expected(s[first]))
    _drop_pages(_shard_files(store))
    fds.state[ST_MAP_BUDGET] = 1 << 40  # (mapped from now on)
    np.testing.assert_array_equal(_read(reader, a, s), _expected(s))
    assert fds.mapped_reads == 0 and fds.mapped_bytes > 0  # mapped, read by the pool
    np.testing.assert_array_equal(_read(reader, a, s), _expected(s))  # now cached
    assert fds.mapped_reads == 400
    reader.close(), store.close()


def test_open_takes_map_bytes(tmp_path) -> None:
    store, rows, steps = _filled(tmp_path / "s.zarr")
    store.close()
    with pytest.raises(ValueError, match="map_bytes: expected an int >= 0"):
        es.open(tmp_path / "s.zarr", map_bytes=-1)
    for budget, mapped in ((0, False), (None, True)):
        reader_store = es.open(tmp_path / "s.zarr", map_bytes=budget)
        reader_store.sample(64)
        assert (reader_store.reader.tables["obs"].fds.mapped_bytes > 0) == mapped
        reader_store.close()


def test_make_loader_checks_map_bytes(tmp_path) -> None:
    store, _, _ = _filled(tmp_path / "s.zarr")
    with pytest.raises(ValueError, match="map_bytes: expected an int >= 0"):
        es.make_loader(store, batch_size=8, num_workers=0, map_bytes=-1)
    store.close()


TRUNCATED = textwrap.dedent("""
    import faulthandler, mmap, os, sys
    faulthandler.enable()  # (as pytest does: a handler before the kernel's)
    sys.path.insert(0, {tests!r})
    import numpy as np
    from test_shard_maps import NOISE, _filled, _reader
    from expstore.storage.native import set_read_depth

    set_read_depth({depth})
    store, _, _ = _filled({path!r})
    reader = _reader(store)
    reader.known[0] = store.index.count[0]  # (committed: what the kernel may trust)
    fds = reader.tables["obs"].fds
    rows = np.arange(64, 128, 2)  # shard 1, complete: 32 runs
    steps = store.index.steps(rows)
    flat = np.zeros((len(rows), NOISE[0] * NOISE[1]), np.uint8)
    args = (rows // 64, rows % 64, steps, np.arange(len(rows)))
    for _ in range(4):  # warm: mapped (the deferred path after 64 warm runs)
        done, _ = fds.read(*args, flat, reader.stats)
        assert done.all()
    assert fds.mapped_reads > 0 and fds.tab[1, fds.MAP_AT] > 0
    # the inode this reader holds truncated in place (as a writer's spare is): its
    # mapped pages past the end raise SIGBUS
    path = os.path.join(store.backend.root, store.layout.shard_key("obs", 1))
    os.truncate(path, 100)
    before = fds.mapped_reads
    for _ in range(3):
        done, _ = fds.read(*args, flat, reader.stats)
        assert not done.any(), done
    print("refused", fds.mapped_reads - before, flush=True)
    # a SIGBUS that is not the kernel's still ends the process, through faulthandler
    with open({spare!r}, "w+b") as f:
        f.truncate(8192)
        m = mmap.mmap(f.fileno(), 8192)
        f.truncate(0)
        print("touching", flush=True)
        m[4096]
    print("survived", flush=True)
""")


@pytest.mark.parametrize("depth_", [1, 16], ids=["depth1", "depth16"])
def test_a_file_truncated_under_its_mapping_fails_the_read_not_the_process(
        tmp_path, depth_) -> None:
    script = TRUNCATED.format(tests=os.path.dirname(__file__), depth=depth_,
                              path=str(tmp_path / "s.zarr"), spare=str(tmp_path / "spare"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert "refused" in proc.stdout and "touching" in proc.stdout, proc.stderr
    assert "survived" not in proc.stdout
    assert proc.returncode == -7, (proc.returncode, proc.stderr)  # SIGBUS, as before
    # the kernel's own SIGBUS never reached faulthandler; the other one did
    assert proc.stderr.count("Bus error") == 1, proc.stderr
