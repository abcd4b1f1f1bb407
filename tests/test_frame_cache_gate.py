"""A frame cache that cannot pay for itself is passed by, and judged again now and then.

Direct-mapped by row, a cache much smaller than the rows a sampler draws from serves
few lookups (slots / rows for uniform draws) while every miss still costs its placement.
It judges itself by the lookups that found their slot taken (an empty slot is a cache
still filling, not a useless one), is passed by below its line (``BYPASS_BELOW``;
``FRAME_BYPASS_BELOW`` for image frames) except one read in ``PROBE_EVERY``, and the
batches read either way are the same.
"""

from __future__ import annotations

import numpy as np
from test_batch_path import _check_sampled, make_store, write

import expstore as es
from expstore.storage.read import read_cache
from expstore.storage.read.read_cache import SLOT_KEY_BYTES, RowCache


def _read(cache: RowCache, rows: np.ndarray) -> None:
    """One read of ``rows`` (lane step = row) through ``cache``, as ``serve_held`` makes
    it: placed, then the rows decoded into their own slots kept."""
    rows = np.unique(rows)
    steps = rows.copy()
    placed = cache.place(rows, steps, np.ones(len(rows), bool))
    assert placed is not None
    pos, hit, own = placed
    cache.keep(rows[own], steps[own])


def test_a_cache_much_smaller_than_its_draws_is_passed_by_and_probed():
    rng = np.random.default_rng(0)
    cache = RowCache(row_bytes=4, budget=(4 + SLOT_KEY_BYTES) * 1088)  # 1020 slots, 68 of scratch
    assert cache.n == 1020
    reads = 0
    while cache.engaged():  # uniform draws from 50x its slots: ~2% of lookups served
        _read(cache, rng.integers(0, 50 * cache.n, 64))
        reads += 1
        assert reads < 2000
    assert cache.hit_rate < 0.1
    for _ in range(read_cache.PROBE_EVERY - 1):  # passed by ...
        assert not cache.engaged()
        cache.skip()
    assert cache.engaged()  # ... but one read in PROBE_EVERY uses it
    _read(cache, rng.integers(0, 50 * cache.n, 64))
    assert not cache.engaged()  # judged again: still passed by
    cache.clear()
    assert cache.engaged() and cache.hit_rate == 1.0


def test_a_cache_with_a_slot_per_row_stays_engaged_while_it_fills():
    """Every lookup of a new cache misses; the misses into empty slots do not count
    against it. Once full, the rows it holds serve everything."""
    rng = np.random.default_rng(1)
    rows = 4096
    cache = RowCache(row_bytes=4, budget=(4 + SLOT_KEY_BYTES) * 2 * rows, rows=rows)
    while (cache.tag == 0).any():
        assert cache.engaged()
        _read(cache, rng.integers(0, rows, 64))
    assert cache.hit_rate == 1.0 and cache.engaged()


def test_a_judged_cache_follows_the_draws_back_to_rows_it_holds():
    """Passed by under uniform draws, the cache is engaged again when the sampler turns
    to a set of rows it can hold (the probes fill it)."""
    rng = np.random.default_rng(2)
    cache = RowCache(row_bytes=4, budget=(4 + SLOT_KEY_BYTES) * 1088)
    while cache.engaged():
        _read(cache, rng.integers(0, 50 * cache.n, 64))
    probes = 0
    while cache.hit_rate < read_cache.BYPASS_BELOW:
        if not cache.engaged():
            cache.skip()
            continue
        _read(cache, rng.integers(0, cache.n // 2, 64))  # a hot set of half its slots
        probes += 1
        assert probes < 500
    for _ in range(20):
        _read(cache, rng.integers(0, cache.n // 2, 64))
        assert cache.engaged()


def test_image_frames_keep_a_cache_that_small_rows_pass_by():
    """A hit saves an image frame's decode: a cache of 1 KiB rows serving ~a third of its
    lookups stays engaged (``FRAME_BYPASS_BELOW``); one of 4-byte rows serving as many is
    passed by (``BYPASS_BELOW``)."""
    for row_bytes, engaged in ((1024, True), (4, False)):
        rng = np.random.default_rng(3)
        cache = RowCache(row_bytes=row_bytes, budget=(row_bytes + SLOT_KEY_BYTES) * 1088)
        for _ in range(400):  # uniform draws from ~2.9x its slots
            if not cache.engaged():
                cache.skip()
                continue
            _read(cache, rng.integers(0, 3000, 64))
        assert 0.25 < cache.hit_rate < 0.45, cache.hit_rate
        assert cache.engaged() == engaged, row_bytes
    assert read_cache.BYPASS_BELOW > 0.45 > 0.25 > read_cache.FRAME_BYPASS_BELOW


def test_a_store_passes_a_useless_frame_cache_by_and_reads_the_same_batches(tmp_path):
    """A 4,096-row store of 1 KiB frames and a cache of 64 of them: sampled uniformly,
    the cache is passed by on most reads, and each batch equals the one a reader without
    a cache reads for the same draws."""
    def check(cache, st):
        assert cache.n == 64
        assert not cache.engaged() and cache.hit_rate < 0.2
        assert st.row_cache_bypassed > 100  # most reads of obs and next_obs passed it by
        assert st.row_cache_hits + st.row_cache_misses > 0  # the probes still used it

    _same_batches_as_no_cache(tmp_path, slots=68, batches=200, check=check)


def test_a_frame_cache_kept_at_a_third_of_hits_reads_the_same_batches(tmp_path):
    """1 KiB frames and a cache of ~1/3 of the store: kept (image frames' line), its slots
    replaced read after read, every batch equals the one a reader without a cache reads
    for the same draws."""
    def check(cache, st):
        assert read_cache.FRAME_BYPASS_BELOW < cache.hit_rate < read_cache.BYPASS_BELOW
        assert cache.engaged() and st.row_cache_hits > 1000 and st.row_cache_bypassed < 50

    _same_batches_as_no_cache(tmp_path, slots=1400, batches=150, check=check)


def _same_batches_as_no_cache(tmp_path, slots: int, batches: int, check) -> None:
    """A 4,096-row store of 1 KiB frames, wrapped once, opened with a frame cache of
    ``slots`` frames (keys included) and without one: ``batches`` seeded batches of 32
    from each are equal; then ``check(frame cache, counters)`` of the cached reader,
    before it is closed (closing clears the cache)."""
    store = make_store(tmp_path / "s.zarr", capacity=4096, shard_rows=256)
    write(store, 0, 0, 4096 + 300)
    store.close()
    cached = es.open(tmp_path / "s.zarr", cache_bytes=(1024 + SLOT_KEY_BYTES) * slots)
    plain = es.open(tmp_path / "s.zarr", cache_bytes=0)
    try:
        for i in range(batches):
            a = cached.sample(32, rng=np.random.default_rng(i))
            b = plain.sample(32, rng=np.random.default_rng(i))
            _check_sampled(a)
            for k in a:
                np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
        check(cached.reader.row_caches["obs"], cached.reader.stats)
    finally:
        cached.close()
        plain.close()
