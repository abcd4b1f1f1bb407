"""Scalar chunks held compressed by the kernel, and how a reader's kernel budgets are split.

Where a scalar field's decoded values would hold fewer than half of its shards (a 100M-row
store: 14 B/row decoded), the reader keeps the field's budget as *held chunks*: each
shard's compressed chunk, once read, stays in a byte arena (oldest overwritten first) with
the version it came from, and later rows of that version are decoded from RAM, with no
descriptor and no read. These tests read real stores written by ``Store.add`` and compare
every value with the general path (numcodecs, parsed indexes).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from test_batch_path import FRAME, make_store, write
from test_kernel_reads import _filled, _general

import expstore as es
from expstore.storage import backend_for
from expstore.storage.native.kernels import native
from expstore.storage.read import ShardReader
from expstore.storage.read.kernel_budget import (
    FDS_METADATA,
    FDS_ONE_CHUNK,
    held_need,
    kernel_shares,
)

if native is None and os.environ.get("EXPSTORE_REQUIRE_NATIVE"):
    raise RuntimeError("expstore.storage.native._kernels was not built (EXPSTORE_REQUIRE_NATIVE=1)")
pytestmark = pytest.mark.skipif(native is None, reason="C kernel not built")

SCALARS = ["action", "reward", "terminated", "truncated", "step"]


def _store(tmp_path, capacity=8192, shard_rows=256, n=7000):
    return _filled(tmp_path, capacity=capacity, shard_rows=shard_rows, n=n)


def _same_as_general(reader, general, rows, steps) -> None:
    got = reader.read_fields(SCALARS, rows, steps)
    for name in SCALARS:
        f = reader.layout.fields[name]
        expect = np.zeros((len(rows), *f.shape), f.dtype)
        assert general.read(name, rows, steps, expect).all()
        values, ok = got[name]
        assert ok.all(), name
        assert np.array_equal(values, expect), name


def test_held_chunks_serve_rows_without_reads(tmp_path) -> None:
    """Decoded values would hold 7 of 32 shards: the budget holds the compressed chunks
    of all 32 instead, and once each shard was read, rows are served with no descriptor
    opened and no byte read."""
    store, rows, steps = _store(tmp_path)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0,
                         values_budget=40_000, max_fds=1000)
    general = _general(store)
    table = reader.tables["step"]
    assert table.max_slots == 0 and not table.fills  # no decoded values kept
    held = table.fds.held
    assert held is not None and len(held) == 40_000 * 8 // 22
    rng = np.random.default_rng(0)
    for _ in range(10):
        pick = rng.choice(len(rows), 48, replace=False)
        _same_as_general(reader, general, rows[pick], steps[pick])
    _same_as_general(reader, general, rows, steps)  # every shard read once at least
    n_shards = len(np.unique(rows // 256))
    # `action` (5 values) and the flags are held as codes (``scalar_codes.py``), decoded
    # whole in a few bytes; `step` compresses well (4-10x): all its chunks fit; `reward`
    # (a float per step) does not compress, and its arena holds only the newest chunks
    coded = ["action", "terminated", "truncated"]
    assert all(reader.tables[n].code is not None and reader.tables[n].fds.held is None
               for n in coded)
    fit = ["step"]
    for name in fit:
        fds = reader.tables[name].fds
        assert (fds.held_tab[:, fds.H_POS] >= 0).sum() == n_shards, name
        assert fds.held_state[0] <= len(fds.held)  # it all fit: nothing overwritten
    opened = [reader.tables[n].fds.opened for n in fit]
    for _ in range(10):
        pick = rng.choice(len(rows), 48, replace=False)
        _same_as_general(reader, general, rows[pick], steps[pick])
    _same_as_general(reader, general, rows, steps)
    assert [reader.tables[n].fds.opened for n in fit] == opened
    requests = reader.stats.requests
    got = reader.read_fields(fit + coded, rows, steps)
    assert all(got[n][1].all() for n in fit + coded)
    assert reader.stats.requests == requests  # no byte read
    assert not reader.heads  # nothing went through the general path
    store.close()


def test_an_arena_smaller_than_the_chunks_overwrites_the_oldest(tmp_path) -> None:
    """An arena of room for a few chunks: older chunks are overwritten as new ones are
    read, rows of overwritten chunks are read again, and every value is still right."""
    store, rows, steps = _store(tmp_path)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0,
                         values_budget=6000, max_fds=1000)
    general = _general(store)
    fds = reader.tables["step"].fds
    one = int(fds.held_state[0])
    _same_as_general(reader, general, rows[:1], steps[:1])
    one = int(fds.held_state[0]) - one  # bytes of one compressed chunk of `step`
    assert 0 < one and 3 * one < len(fds.held) < 10 * one
    rng = np.random.default_rng(1)
    for _ in range(30):
        pick = rng.choice(len(rows), 24, replace=False)
        _same_as_general(reader, general, rows[pick], steps[pick])
    assert fds.held_state[0] > 4 * len(fds.held)  # the arena went round several times
    intact = fds.held_tab[:, fds.H_POS] >= fds.held_state[0] - len(fds.held)
    assert 0 < intact.sum() < 10  # only the newest chunks are still held
    before = reader.stats.requests
    _same_as_general(reader, general, rows, steps)
    assert reader.stats.requests > before  # overwritten chunks were read again
    store.close()


def test_held_chunks_of_an_overwritten_shard_are_not_served(tmp_path) -> None:
    """A lap of the ring rewrites shards: rows of the new steps come from the new
    versions, the held chunks of the old ones never stand in for them, and the old steps
    are no longer delivered."""
    store, rows, steps = _store(tmp_path, capacity=1024, shard_rows=256, n=900)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0,
                         values_budget=6000, max_fds=1000)
    general = _general(store)
    fds = reader.tables["step"].fds
    assert fds.held is not None
    _same_as_general(reader, general, rows, steps)
    assert (fds.held_tab[:, fds.H_POS] >= 0).sum() == 4  # all four shards held
    write(store, 0, 900, 300)  # a new lap over shards 0 and 1
    store.flush()
    new_steps = store.index.steps(rows)
    moved = new_steps != steps
    assert moved.any() and (~moved).any()
    reader.known[:] = store.index.count  # what the sampler would ask for now
    _same_as_general(reader, general, rows[moved], new_steps[moved])
    got = reader.read_fields(["step"], rows[moved], steps[moved])["step"]
    assert not got[1].any()  # old steps of rewritten rows: not delivered
    store.close()


def test_budgets_favour_frames_with_descriptors_and_scalars_with_bytes(tmp_path) -> None:
    store = make_store(tmp_path / "s.zarr", capacity=8192, shard_rows=256)
    L = store.layout
    meta = [n for n in L.fields if n not in L.spec.fields]
    # room for every shard decoded: values; for a few: held chunks, same bytes, but for
    # the flags, decoded as 1-bit codes (a few bytes a shard)
    for budget, decoded in ((1 << 20, True), (40_000, False)):
        shares = kernel_shares(L, 1000, budget)
        assert sum(s.fds for s in shares.values()) <= 1000
        assert all(shares[n].fds == FDS_METADATA for n in meta)
        # (32 shards: no field gets more descriptors than it has shards)
        assert all(shares[n].fds == min(32, FDS_ONE_CHUNK) for n in SCALARS)
        assert shares["obs"].fds == 32
        many = kernel_shares(dataclasses.replace(L, capacity=L.shard_rows * 4096), 1000, budget)
        assert all(many[n].fds == FDS_ONE_CHUNK for n in SCALARS)
        assert many["obs"].fds == 1000 - FDS_METADATA * len(meta) - FDS_ONE_CHUNK * 5
        for n in SCALARS:
            s, flag = shares[n], n in ("terminated", "truncated")
            assert (s.values_bytes > 0, s.held_bytes > 0) == (decoded or flag,
                                                              not (decoded or flag)), n
            assert s.code_bits == (None if decoded or not flag else 1), n
        assert sum(s.values_bytes + s.held_bytes for s in shares.values()) <= budget
    # a budget too small for 64 each: every field of the spec gets an even share
    shares = kernel_shares(L, 8 * len(L.spec.fields) + FDS_METADATA * len(meta), 1 << 20)
    assert {shares[n].fds for n in L.spec.fields} == {8}
    store.close()


def test_kernel_refuses_held_chunks_for_frames(tmp_path) -> None:
    store, rows, steps = _store(tmp_path, capacity=1024, shard_rows=256, n=500)
    fds = ShardReader(backend_for(store.url), store.layout).tables["obs"].fds
    args = [fds.prefix, fds.suffix, fds.n_chunks, fds.chunk_rows, 4, FRAME[0] * FRAME[1],
            False, np.array([600], np.int64), fds.tab, fds.ring, fds.state, fds.entries]
    held = (np.zeros(64, np.uint8), np.full((len(fds.tab), 5), -1, np.int64),
            np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="held chunks need chunks of more than one row"):
        native.ReadState(*args, *held)
    store.close()


def _tiny_rows_store(tmp_path, capacity=65536, shard_rows=4096):
    """Every row a 2-byte observation (a vector, multi-row chunks) and scalars that
    compress to almost nothing: what a held arena needs is far below its share."""
    spec = es.Spec.create(obs=es.Field((2,), np.uint8), action=es.Field((), np.int64))
    store = es.create(tmp_path / "tiny.zarr", spec, capacity=capacity, shard_rows=shard_rows)
    n = capacity - 1  # (the last row: the lane's next obs)
    obs = (np.arange(n + 1)[:, None] * [1, 7] % 251).astype(np.uint8)
    store.extend(obs=obs[:-1], action=np.zeros(n, np.int64), reward=np.zeros(n, np.float32),
                 next_obs=obs[1:], terminated=np.zeros(n, bool), truncated=np.zeros(n, bool))
    store.flush()
    return store


def test_held_arenas_sized_to_their_chunks_leave_the_rest_to_decoded_vectors(tmp_path
                                                                             ) -> None:
    """Held arenas keep what every shard's chunk takes (shard files stat'ed, with
    headroom), not their share of the budget; fields are decoded smallest row first with
    the rest: the flags and the 2-byte observations whole, the action and reward held.
    Rows read are the same as the general path's."""
    store = _tiny_rows_store(tmp_path)
    L = store.layout
    root = backend_for(store.url).root
    needs = {n: held_need(root, L, n) for n in ("action", "reward", "terminated", "truncated")}
    assert all(0 < need < 16 * 1024 for need in needs.values())  # ~tiny compressed chunks
    whole = {n: L.capacity * L.fields[n].row_nbytes for n in ("terminated", "truncated", "obs")}
    budget = sum(whole.values()) + needs["reward"] + needs["action"]
    plain, sized = kernel_shares(L, 1000, budget), kernel_shares(L, 1000, budget, needs.get)
    whole.update(terminated=L.capacity // 8, truncated=L.capacity // 8)  # (1-bit codes)
    for n, values in whole.items():
        assert (sized[n].values_bytes, sized[n].held_bytes) == (values, 0), n
    for n in ("reward", "action"):
        assert (sized[n].values_bytes, sized[n].held_bytes) == (0, needs[n]), n
        assert plain[n].held_bytes > needs[n]  # its share of the budget, unsized
    assert plain["obs"].values_bytes < whole["obs"]
    assert sum(s.values_bytes + s.held_bytes for s in sized.values()) <= budget
    n_shards = L.capacity // L.shard_rows

    reader = ShardReader(backend_for(store.url), L, row_cache_bytes=0, values_budget=budget,
                         max_fds=1000)
    assert all(reader.tables[n].max_slots == n_shards for n in whole)  # decoded whole
    rows = np.random.default_rng(0).permutation(L.capacity - 1)[:4000]
    steps = store.index.steps(rows)
    general = _general(store)
    for _ in range(2):  # filling, then filled
        got = reader.read_fields(["obs", "action"], rows, steps)
        for name in ("obs", "action"):
            f = L.fields[name]
            expect = np.zeros((len(rows), *f.shape), f.dtype)
            assert general.read(name, rows, steps, expect).all()
            values, ok = got[name]
            assert ok.all() and np.array_equal(values, expect), name
    store.close()


def test_chunks_of_part_of_a_shard_are_held_each_on_its_own(tmp_path, monkeypatch) -> None:
    """Scalars of shards larger than ``Layout.scalar_chunk_rows`` (stores of more than
    ~270M rows) come in several chunks per shard: the arena keeps each chunk read with its
    version, so rows of every chunk of a shard are served from RAM, where an arena keyed
    by shard kept one chunk of each and read the others again at every switch."""
    import expstore.api

    monkeypatch.setattr(expstore.api, "SCALAR_CHUNK_ROWS", 64)  # 4 chunks per 256-row shard
    store, rows, steps = _store(tmp_path)
    assert store.layout.chunk_rows("step") == 64 and store.layout.chunk_rows("_flags") == 64
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0,
                         values_budget=40_000, max_fds=1000)
    general = _general(store)
    fds = reader.tables["step"].fds
    assert fds.held is not None and len(fds.held_tab) == 4 * store.capacity // 256
    _same_as_general(reader, general, rows, steps)  # every chunk read once
    n_chunks = len(np.unique(rows // 64))
    assert (fds.held_tab[:, fds.H_POS] >= 0).sum() == n_chunks
    assert fds.held_state[0] <= len(fds.held)  # it all fit: nothing overwritten
    expect = np.zeros(len(rows), np.int64)
    assert general.read("step", rows, steps, expect).all()
    rng = np.random.default_rng(2)
    requests, opened = reader.stats.requests, fds.opened
    for _ in range(10):  # rows of every chunk, in any order
        pick = rng.choice(len(rows), 48, replace=False)
        got = reader.read_fields(["step"], rows[pick], steps[pick])["step"]
        assert got[1].all() and np.array_equal(got[0], expect[pick])
    assert (reader.stats.requests, fds.opened) == (requests, opened)  # no byte read
    _same_as_general(reader, general, rows, steps)
    store.close()


def test_fields_held_whole_take_few_descriptors_and_leave_them_to_the_rest(
        tmp_path, monkeypatch) -> None:
    """Scalars in chunks of part of a shard (4 of 1,024 rows a 4,096-row shard): a field
    the hot set decodes whole, or whose arena holds every chunk, needs a descriptor only
    while it fills, and takes :data:`FDS_ONE_CHUNK`; the fields read past the hot set (the
    observations held in part, the reward whose arena holds half its chunks) share the
    rest."""
    import expstore.api

    monkeypatch.setattr(expstore.api, "SCALAR_CHUNK_ROWS", 1024)
    store = _tiny_rows_store(tmp_path, capacity=128 * 4096)  # 128 shards: none capped
    L = store.layout
    assert L.chunks_per_shard("action") == 4
    root = backend_for(store.url).root
    needs = {n: held_need(root, L, n) for n in ("action", "reward", "terminated", "truncated")}
    flags = 2 * (L.capacity // 8)  # terminated and truncated as 1-bit codes
    budget = flags + needs["action"] + needs["reward"] // 2 + L.capacity // 4  # obs: part
    shares = kernel_shares(L, 400, budget, needs.get)
    meta = len(L.fields) - len(L.spec.fields)
    assert shares["action"].held_bytes >= needs["action"]
    assert 0 < shares["reward"].held_bytes < needs["reward"]
    assert 0 < shares["obs"].values_bytes < L.capacity * 2
    light = ["action", "terminated", "truncated"]
    assert [shares[n].fds for n in light] == [FDS_ONE_CHUNK] * 3
    rest = (400 - FDS_METADATA * meta - FDS_ONE_CHUNK * 3) // 2
    assert shares["obs"].fds == shares["reward"].fds == rest
    store.close()
