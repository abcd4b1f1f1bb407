"""A batch's lookups around the reads in C (``storage/native/batch_lookup.h``) against numpy.

``first_index`` (distinct frame keys of a batch), ``table_rows`` (scalars from decoded
shards), ``place_rows`` (where each frame goes in the frame cache) and ``rows_held`` (rows
an open shard version holds) must give what the numpy code they replace gives: same rows,
same cache state after.
``EXPSTORE_REQUIRE_NATIVE=1`` (set by CI) turns a missing kernel into a failure.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from expstore.storage.native import kernels
from expstore.storage.read import read_cache
from expstore.storage.read.read_cache import SLOT_KEY_BYTES, RowCache, ShardTable

native = kernels.native
if native is None and os.environ.get("EXPSTORE_REQUIRE_NATIVE"):
    raise RuntimeError("expstore.storage.native._kernels was not built (EXPSTORE_REQUIRE_NATIVE=1)")
pytestmark = pytest.mark.skipif(native is None, reason="C kernel not built")


@pytest.mark.parametrize("n,span", [(1, 1), (7, 3), (256, 40), (256, 100_000), (5000, 900)])
def test_unique_first_finds_each_key_once_at_its_first_appearance(monkeypatch, n, span):
    rng = np.random.default_rng(n + span)
    keys = rng.integers(0, span, n).astype(np.int64)
    first, inv = kernels.unique_first(keys)
    assert len(set(keys[first].tolist())) == len(first) == len(np.unique(keys))
    np.testing.assert_array_equal(keys[first][inv], keys)
    np.testing.assert_array_equal(first, np.sort(first))  # order of appearance
    for j, i in enumerate(first):
        assert not (keys[:i] == keys[i]).any(), j
    with monkeypatch.context() as m:
        m.setattr(kernels, "native", None)
        f2, inv2 = kernels.unique_first(keys)
    assert sorted(keys[f2].tolist()) == sorted(keys[first].tolist())
    np.testing.assert_array_equal(keys[f2][inv2], keys)


def test_unique_first_takes_negative_keys_the_numpy_way():
    keys = np.array([3, -1, 3, -1, 0], np.int64)
    first, inv = kernels.unique_first(keys)
    np.testing.assert_array_equal(keys[first][inv], keys)
    assert sorted(keys[first].tolist()) == [-1, 0, 3]


def _cache(rng: np.random.Generator, n_rows: int = 64) -> RowCache:
    cache = RowCache(row_bytes=4, budget=(4 + SLOT_KEY_BYTES) * n_rows)
    held = rng.random(cache.n) < 0.6
    cache.tag[held] = 1 + np.flatnonzero(held) + cache.n * rng.integers(0, 3, held.sum())
    cache.step[held] = rng.integers(0, 4, held.sum())
    return cache


@pytest.mark.parametrize("seed", range(30))
def test_place_rows_matches_the_numpy_placement(monkeypatch, seed):
    rng = np.random.default_rng(seed)
    a = _cache(rng)
    b = RowCache(4, (4 + SLOT_KEY_BYTES) * 64)
    b.tag[:], b.step[:] = a.tag, a.step
    k = int(rng.integers(1, 40))
    # distinct (row, step) pairs, many sharing a slot, many cached already
    pairs = {(int(r), int(s)) for r, s in zip(rng.integers(0, 3 * a.n, 3 * k),
                                             rng.integers(0, 4, 3 * k))}
    pairs |= {(int(a.tag[i]) - 1, int(a.step[i])) for i in np.flatnonzero(a.tag > 0)[:k]}
    pairs = sorted(pairs)
    rng.shuffle(pairs)
    rows = np.array([p[0] for p in pairs], np.int64)
    steps = np.array([p[1] for p in pairs], np.int64)
    servable = rng.random(len(rows)) < 0.8
    cacheable = None if seed % 3 == 0 else servable | (rng.random(len(rows)) < 0.3)
    fast = a.place(rows, steps, servable, cacheable)
    with monkeypatch.context() as m:
        m.setattr(read_cache, "native", None)
        slow = b.place(rows, steps, servable, cacheable)
    assert (fast is None) == (slow is None)
    np.testing.assert_array_equal(a.tag, b.tag)  # slots emptied alike (or left alone)
    if slow is not None:
        for name, x, y in zip(("pos", "hit", "own"), fast, slow):
            np.testing.assert_array_equal(x, y, name)
        assert fast[1].any() and (fast[0] >= a.n).any() or len(rows) < 8


@pytest.mark.parametrize("row_bytes", [16, 7056])
def test_a_row_cache_stays_within_its_budget_keys_included(row_bytes):
    """The slots' keys (row, step) count against the budget: for 16-byte rows (tiny
    frames) they take half of it, for an Atari frame 0.2%."""
    budget = 64 << 20
    cache = RowCache(row_bytes, budget)
    taken = cache.data.nbytes + cache.tag.nbytes + cache.step.nbytes
    assert 0.95 * budget < taken <= budget  # (scratch rows keep no key)


def test_a_row_cache_takes_no_more_slots_than_the_store_has_rows():
    """A 256 MiB cache of 16-byte frames for a 1,000-row store: 1,000 direct-mapped slots,
    not 7.9M."""
    cache = RowCache(16, 256 << 20, rows=1000)
    assert cache.n == 1000 and cache.tag.nbytes == cache.step.nbytes == 8000
    assert cache.scratch == (256 << 20) // 32 // 16  # (scratch rows: pages used lazily)
    rows = np.arange(1000, dtype=np.int64)
    pos, hit, own = cache.place(rows, np.zeros(1000, np.int64), np.ones(1000, bool))
    assert own.all() and not hit.any() and np.array_equal(pos, rows)  # a slot per row


def _rss_anon_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("RssAnon:")) / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
def test_a_new_row_cache_writes_none_of_its_keys():
    """A cache's keys start as zeroed pages (a slot's tag is its row + 1, 0: empty), taken
    from the system as slots are first used: a 512 MiB cache of 16-byte frames has 268 MB
    of keys, which keys of -1 written at open put in RSS at once (at 100M rows, 126 MB and
    0.43 s of the open, for a cache such a store passes by)."""
    before = _rss_anon_mb()
    cache = RowCache(16, 512 << 20)
    assert cache.tag.nbytes + cache.step.nbytes > 250e6
    assert _rss_anon_mb() - before < 32
    rows = np.arange(0, 64 * 4096, 4096, dtype=np.int64)  # a few slots used: their pages
    pos, hit, own = cache.place(rows, np.zeros(len(rows), np.int64), np.ones(len(rows), bool))
    assert own.all() and not hit.any()
    cache.keep(rows, np.zeros(len(rows), np.int64))
    pos, hit, own = cache.place(rows, np.zeros(len(rows), np.int64), np.ones(len(rows), bool))
    assert hit.all() and np.array_equal(pos, rows % cache.n)
    assert _rss_anon_mb() - before < 32


def test_place_rows_leaves_the_cache_alone_when_scratch_is_short():
    cache = RowCache(row_bytes=4, budget=(4 + SLOT_KEY_BYTES) * 32)  # 30 slots, 2 of scratch
    assert (cache.n, cache.scratch) == (30, 2)
    rows = np.array([0, 30, 60, 90], np.int64)  # one slot for all four
    before = cache.tag.copy()
    assert cache.place(rows, np.zeros(4, np.int64), np.ones(4, bool)) is None
    np.testing.assert_array_equal(cache.tag, before)


def _table(rng: np.random.Generator) -> tuple[ShardTable, np.ndarray, np.ndarray, np.ndarray]:
    """A table of 6 shards of 8 rows (float32 pairs), 4 of them decoded; rows they hold."""
    t = ShardTable(6, 8, 8, (2,), np.float32, values_budget=1 << 20)
    for shard in (0, 2, 3, 5):
        values = rng.random((8, 2)).astype(np.float32)
        s = t._take_slot(shard)
        t.values[s] = values
        t.first[shard], t.n_rows[shard], t.trusted[shard] = shard * 8, 8, shard * 8 + 7
    rows = np.array([1, 17, 26, 40, 3, 46], np.int64)
    shards = rows // 8
    return t, shards, rows - shards * 8, rows  # step == row: first step shard * 8


def test_table_rows_gathers_held_rows_and_refuses_any_other():
    rng = np.random.default_rng(0)
    t, shards, slots, steps = _table(rng)
    out = np.full((len(shards), 2), -1, np.float32)
    assert native.table_rows(shards, slots, steps, t.first, t.n_rows, t.trusted, t.slot,
                             t.values, 8, out)
    np.testing.assert_array_equal(out, t.values[t.slot[shards], slots])
    assert t.ready(shards, slots, steps).all()
    untrusted = steps.copy()
    untrusted[-1] = 47  # shard 5's last row: beyond the count its version is trusted for
    for name, args in (("another version", (shards, slots, steps + 1)),
                       ("a shard not decoded", (np.where(shards == 5, 4, shards), slots,
                                                np.where(shards == 5, steps - 8, steps))),
                       ("not trusted", (shards, untrusted - shards * 8, untrusted))):
        out = np.full((len(shards), 2), -1, np.float32)
        assert not native.table_rows(*args, t.first, t.n_rows, t.trusted, t.slot, t.values, 8,
                                     out), name
        assert (out == -1).all(), name  # nothing written
        assert not t.ready(*args).all(), name


@pytest.mark.parametrize("seed", range(4))
def test_rows_held_matches_the_numpy_check(seed):
    """``FdTable.ready``'s kernel call gives the numpy check of the table it replaced: a
    version open (fd >= 0) whose header holds the step at that slot, trusted for it."""
    from expstore.storage.read.fd_table import ECACHE_COLS, STATE_LEN, TAB_COLS, FdTable

    rng = np.random.default_rng(seed)
    n_shards, shard_rows, n = 50, 64, 4000
    tab = np.zeros((n_shards, TAB_COLS), np.int64)  # (no mapping: MAP_AT 0)
    tab[:, FdTable.FD] = rng.choice([-1, 3, 7], n_shards)
    tab[:, FdTable.FIRST] = rng.integers(0, 4, n_shards) * shard_rows
    tab[:, FdTable.NROWS] = rng.integers(0, shard_rows + 1, n_shards)
    tab[:, FdTable.TRUSTED] = tab[:, FdTable.FIRST] + rng.integers(0, shard_rows + 1, n_shards)
    state = native.ReadState(b"/nonexistent/c/", b"", 1, 1, n_shards, 4, True,
                             np.zeros(1, np.int64), tab, np.full(4, -1, np.int64),
                             np.zeros(STATE_LEN, np.int64), np.full((8, ECACHE_COLS), -1, np.int64))
    shards = rng.integers(0, n_shards, n)
    slots = rng.integers(0, shard_rows, n)
    steps = tab[shards, FdTable.FIRST] + slots + rng.choice([0, 0, 0, 1, -1], n)
    out = np.zeros(n, bool)
    native.rows_held(state, shards, slots, steps, out)
    e = tab[shards]
    want = ((e[:, FdTable.FD] >= 0) & (e[:, FdTable.FIRST] + slots == steps)
            & (slots < e[:, FdTable.NROWS]) & (steps < e[:, FdTable.TRUSTED]))
    np.testing.assert_array_equal(out, want)
    assert 0 < want.sum() < n  # (both answers are checked)
    with pytest.raises(IndexError, match="rows_held: shard of row 0 out of range"):
        native.rows_held(state, np.array([n_shards]), slots[:1], steps[:1], out[:1])
    with pytest.raises(ValueError, match="one entry per row"):
        native.rows_held(state, shards, slots[:-1], steps, out)
