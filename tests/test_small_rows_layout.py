"""The layout of small rows (issue 26): vector fields (several values per row under 1 KiB:
state observations, continuous actions) in chunks of about ``VECTOR_CHUNK_BYTES``, small
fields' chunks in small blosc blocks, and larger shards for large stores of small rows, so a
row the hot set does not hold costs a few KiB and no shard reopen. Stores made before keep
one chunk per shard and read as they are; plain zarr reads both."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

import expstore as es
import expstore.api
from expstore.storage.format import (
    SCALAR_CHUNK_ROWS,
    VECTOR_CHUNK_BYTES,
    auto_shard_rows,
    vector_chunk_rows,
)
from expstore.storage.format.layout import scalar_chunk_rows

N = 700  # transitions written (the ring holds 1024)


def spec() -> es.Spec:
    return es.Spec.create(obs=es.Field((17,), np.float32),
                          action=es.Field((6,), np.float32, low=-1, high=1))


def fill(path, **kw) -> es.Store:
    store = es.create(path, spec(), capacity=1024, shard_rows=512, fsync=False, **kw)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((N + 1, 17)).astype(np.float32)
    act = rng.uniform(-1, 1, (N, 6)).astype(np.float32)
    for i in range(N):
        end = i % 50 == 49
        store.add(obs[i], act[i], float(i), obs[i + 1], end, False)
    store.flush()
    return store


def test_vector_chunk_rows_stay_within_the_bytes_and_divide_the_shard():
    assert vector_chunk_rows(68, 4096, 8192) == 64  # 17 float32s: 4,352 B chunks
    assert vector_chunk_rows(24, 4096, 8192) == 256  # 6 float32s
    assert vector_chunk_rows(800, 4096, 8192) == 8
    assert vector_chunk_rows(9000, 4096, 8192) == 1  # a row larger than the target
    assert vector_chunk_rows(68, 32, 8192) == 32  # never more than the shard
    assert vector_chunk_rows(68, 100, 8192) == 4  # a divisor of an odd shard size


def test_new_stores_chunk_vectors_and_plain_zarr_reads_them(tmp_path):
    store = fill(tmp_path / "s.zarr")
    L = store.layout
    assert L.vector_chunk_bytes == VECTOR_CHUNK_BYTES
    assert (L.chunk_rows("obs"), L.chunk_rows("action")) == (16, 64)  # 1,088 / 1,536 B
    assert L.chunk_rows("reward") == L.chunk_rows("_flags") == 512  # scalars: the shard
    meta = json.loads((tmp_path / "s.zarr" / "obs" / "zarr.json").read_text())
    sharding = meta["codecs"][0]["configuration"]
    assert sharding["chunk_shape"] == [16, 17]
    rows = np.arange(N)
    got = store.transitions(rows[store.index.valid(rows, 0, 1)])
    store.close()
    z = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    np.testing.assert_array_equal(z["obs"][:N][got["step_id"]], got["obs"])
    np.testing.assert_array_equal(z["action"][:N][got["step_id"]], got["action"])


@pytest.mark.parametrize("made_with,old_rows", [(None, 512), (8192, 64)])
def test_a_store_made_before_vector_chunks_gives_the_same_batches(tmp_path, monkeypatch,
                                                                  made_with, old_rows):
    """Stores made before vector chunks (one chunk per shard) and with the 8 KiB vector
    chunks of the release before (64 rows of obs) read as they are, batch for batch."""
    new = fill(tmp_path / "new.zarr")
    with monkeypatch.context() as m:
        m.setattr(expstore.api, "VECTOR_CHUNK_BYTES", made_with)  # as older expstore wrote
        old = fill(tmp_path / "old.zarr")
    new.close()
    old.close()
    attrs = json.loads((tmp_path / "old.zarr" / "zarr.json").read_text())["attributes"]
    assert attrs["expstore"].get("vector_chunk_bytes") == made_with
    for hot_bytes in (None, 0, 40_000):  # all held, none held, some shards held
        kw = {} if hot_bytes is None else {"hot_bytes": hot_bytes}
        a, b = es.open(tmp_path / "new.zarr", **kw), es.open(tmp_path / "old.zarr", **kw)
        assert b.layout.chunk_rows("obs") == old_rows and a.layout.chunk_rows("obs") == 16
        for seed in range(10):
            x = a.sample(64, rng=np.random.default_rng(seed))
            y = b.sample(64, rng=np.random.default_rng(seed))
            assert x.keys() == y.keys()
            for k in x:
                np.testing.assert_array_equal(x[k], y[k], err_msg=k)
        a.close()
        b.close()


def test_a_row_past_the_hot_set_reads_a_small_chunk(tmp_path, monkeypatch):
    """With no hot set, reading a few rows costs their ~1 KiB chunks, not each shard's
    whole 35 KiB chunk of obs as in a store made before vector chunks."""
    fill(tmp_path / "new.zarr").close()
    with monkeypatch.context() as m:
        m.setattr(expstore.api, "VECTOR_CHUNK_BYTES", None)
        fill(tmp_path / "old.zarr").close()
    read = {}
    for name in ("new", "old"):
        store = es.open(tmp_path / f"{name}.zarr", hot_bytes=0)
        rows = np.arange(N)
        store.transitions(rows[store.index.valid(rows, 0, 1)])  # (every shard opened)
        st = store.reader.stats
        before = st.bytes
        got = store.transitions(np.array([100, 600]))
        read[name] = st.bytes - before
        assert np.isfinite(got["obs"]).all()
        store.close()
    assert 0 < read["new"] < read["old"] / 3, read


def test_small_fields_are_written_in_small_blosc_blocks_and_read_back(tmp_path):
    """A row of a scalar chunk is decoded with the ~1 KiB blosc block holding it (the
    block size each frame records), by the kernel from held compressed chunks as by
    numcodecs."""
    spec_ = es.Spec.create(obs=es.Field((3,), np.float32), action=es.Field((), np.int64))
    store = es.create(tmp_path / "s.zarr", spec_, capacity=8192, shard_rows=4096,
                      fsync=False)
    rng = np.random.default_rng(1)
    acts = rng.integers(0, 1 << 40, 5000)
    for i in range(5000):
        store.add(np.full(3, i, np.float32), int(acts[i]), 0.0, np.full(3, i + 1, np.float32),
                  False, False)
    store.close()
    raw = (tmp_path / "s.zarr" / "action" / "c" / "0").read_bytes()
    off, nb = np.frombuffer(raw[:16], np.uint64)
    blosc = raw[int(off):int(off + nb)]
    assert int.from_bytes(blosc[8:12], "little") == 127 * 8  # block size: 127 int64s
    assert int.from_bytes(blosc[4:8], "little") == 4096 * 8  # 33 blocks in the chunk
    for hot_bytes in (None, 0):  # decoded shards; held compressed chunks (the kernel)
        kw = {} if hot_bytes is None else {"hot_bytes": hot_bytes}
        reader = es.open(tmp_path / "s.zarr", **kw)
        rows = rng.choice(4999, 300, replace=False)
        got = reader.transitions(rows)
        np.testing.assert_array_equal(got["action"], acts[got["obs"][:, 0].astype(np.int64)])
        reader.close()


def test_large_stores_of_small_rows_get_larger_shards(tmp_path):
    """Past 4,096 shards of 4096 rows per field, stores of small rows get up to 16,384-row
    shards (a reader then holds each shard's descriptor), within 8 MiB of staged rows per
    shard and ~1/32 of a lane; Atari-sized rows and smaller stores keep 4096."""
    assert auto_shard_rows(1_000_000, 1, 100) == 4096
    assert auto_shard_rows(16_777_216, 1, 100) == 4096  # exactly 4,096 shards
    assert auto_shard_rows(20_000_000, 1, 100) == 8192
    assert auto_shard_rows(100_000_000, 1, 45) == 16384  # 6,104 shards, not 24,415
    assert auto_shard_rows(100_000_000, 1, 7100) == 4096  # 16,384 rows would be 116 MB
    assert auto_shard_rows(100_000_000, 256, 45) == 8192  # 1/32 of a 390k-row lane
    assert auto_shard_rows(100_000_000, 1) == 4096  # row size not known (as before)
    small = es.Spec.create(obs=es.Field((4,), np.float32), action=es.Field((), np.int64))
    store = es.create(tmp_path / "s.zarr", small, capacity=20_000_000, mode="r")
    assert store.layout.shard_rows == 8192
    store.close()
    again = es.open(tmp_path / "s.zarr")
    assert again.layout.shard_rows == 8192
    again.close()


@pytest.mark.parametrize("key", ["vector_chunk_bytes", "scalar_chunk_rows"])
@pytest.mark.parametrize("bad", ["big", 0, -8192, 8192.5, True])
def test_a_damaged_chunk_attribute_is_named_and_nothing_is_lost(tmp_path, key, bad):
    store = fill(tmp_path / "s.zarr")
    store.close()
    meta = tmp_path / "s.zarr" / "zarr.json"
    good = meta.read_text()
    doc = json.loads(good)
    doc["attributes"]["expstore"][key] = bad
    meta.write_text(json.dumps(doc))
    with pytest.raises(es.StoreCorruptError, match=f"{key}: expected an int"):
        es.open(tmp_path / "s.zarr")
    meta.write_text(good)  # the rows were never touched
    again = es.open(tmp_path / "s.zarr")
    assert len(again) == N + N // 50
    again.close()


def test_the_largest_stores_of_small_rows_get_shards_of_up_to_16_mib():
    """Past 16,384 shards of 16,384 rows per field (~268M rows), small rows get shards of
    up to 16 MiB, 2,048 per field at the fewest: a 1B-row store of tiny rows 1,908
    shards of 524,288 rows, not 61,036; Atari-sized rows keep 4096."""
    assert auto_shard_rows(268_435_456, 1, 45) == 16384  # exactly 16,384 such shards
    assert auto_shard_rows(300_000_000, 1, 45) == 262144  # 1,145 shards, 11.8 MB each
    assert auto_shard_rows(1_000_000_000, 1, 29) == 524288  # 15.2 MB each
    assert auto_shard_rows(1_000_000_000, 1, 45) == 262144  # (16 MiB holds 372k rows)
    assert auto_shard_rows(1_000_000_000, 1, 7100) == 4096
    assert auto_shard_rows(1_000_000_000, 1) == 4096  # row size not known (as before)


def test_scalar_chunks_divide_shards_larger_than_their_rows():
    assert scalar_chunk_rows(512, None) == 512  # stores made before: the shard
    assert scalar_chunk_rows(16384, 16384) == 16384
    assert scalar_chunk_rows(524288, 16384) == 16384
    assert scalar_chunk_rows(20000, 16384) == 10000  # a divisor of an odd shard size
    assert scalar_chunk_rows(32771, 16384) == 32771  # a prime: one chunk, as before
    assert scalar_chunk_rows(256, 64) == 64 and scalar_chunk_rows(258, 64) == 258


def test_scalars_of_shards_past_16384_rows_come_in_chunks_plain_zarr_reads(tmp_path):
    """A store of 32,768-row shards keeps its scalars (and the store's own metadata) in
    16,384-row chunks: the store samples what it stored, and plain zarr reads it."""
    small = es.Spec.create(obs=es.Field((2,), np.uint8), action=es.Field((), np.int64))
    store = es.create(tmp_path / "s.zarr", small, capacity=65536, shard_rows=32768,
                      fsync=False)
    L = store.layout
    assert L.scalar_chunk_rows == SCALAR_CHUNK_ROWS == 16384
    assert [L.chunk_rows(n) for n in ("action", "reward", "_flags", "_step_id")] == [16384] * 4
    n = 50_000
    t = np.arange(n + 1)
    obs = np.stack([t % 251, t % 241], 1).astype(np.uint8)
    store.extend(obs=obs[:n], action=t[:n] * 3, reward=(t[:n] % 7).astype(np.float32),
                 terminated=np.zeros(n, bool), truncated=np.zeros(n, bool))
    store.flush()
    batch = store.sample(512, rng=np.random.default_rng(0))
    steps = batch["step_id"]
    np.testing.assert_array_equal(batch["action"], steps * 3)
    np.testing.assert_array_equal(batch["reward"], (steps % 7).astype(np.float32))
    np.testing.assert_array_equal(batch["obs"], obs[steps])
    store.close()
    meta = json.loads((tmp_path / "s.zarr" / "action" / "zarr.json").read_text())
    assert meta["codecs"][0]["configuration"]["chunk_shape"] == [16384]
    z = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    np.testing.assert_array_equal(z["action"][:n], t[:n] * 3)
    np.testing.assert_array_equal(z["_step_id"][:n], t[:n])


def _tiny(path) -> None:
    spec_ = es.Spec.create(obs=es.Field((2,), np.uint8),
                           action=es.Field((), np.int64, low=0, high=17))
    store = es.create(path, spec_, capacity=2048, shard_rows=512, fsync=False)
    rng = np.random.default_rng(0)
    for i in range(3000):  # the ring wraps; flushed mid-shard now and then
        store.add(np.array([i % 256, i // 256], np.uint8), int(rng.integers(0, 18)),
                  float(rng.integers(-1, 2)), np.array([(i + 1) % 256, (i + 1) // 256],
                                                       np.uint8), i % 97 == 96, False)
        if i % 333 == 0:
            store.flush()
    store.close()


def test_scalars_in_chunks_of_part_of_a_shard_give_the_same_batches(tmp_path, monkeypatch):
    """Scalars in 128-row chunks of 512-row shards, and a store made before
    ``scalar_chunk_rows`` (one chunk per shard), batch for batch: decoded whole, nothing
    held, part held as codes (shards of several chunks coded as they are filled) and
    compressed chunks held, all held as codes; a fill coding one shard at a time."""
    from expstore.storage.read import read_cache

    monkeypatch.setattr(read_cache, "FILL_SCRATCH_BYTES", 1)  # one shard per fill
    with monkeypatch.context() as m:
        m.setattr(expstore.api, "SCALAR_CHUNK_ROWS", 128)
        _tiny(tmp_path / "new.zarr")
    with monkeypatch.context() as m:
        m.setattr(expstore.api, "SCALAR_CHUNK_ROWS", None)  # as older expstore wrote
        _tiny(tmp_path / "old.zarr")
    attrs = json.loads((tmp_path / "old.zarr" / "zarr.json").read_text())["attributes"]
    assert "scalar_chunk_rows" not in attrs["expstore"]
    for hot_bytes in (None, 0, 3000, 9000):
        kw = {} if hot_bytes is None else {"hot_bytes": hot_bytes}
        a, b = es.open(tmp_path / "new.zarr", **kw), es.open(tmp_path / "old.zarr", **kw)
        assert (a.layout.chunk_rows("action"), b.layout.chunk_rows("action")) == (128, 512)
        for seed in range(20):
            x = a.sample(64, rng=np.random.default_rng(seed))
            y = b.sample(64, rng=np.random.default_rng(seed))
            assert x.keys() == y.keys()
            for k in x:
                np.testing.assert_array_equal(x[k], y[k], err_msg=f"{hot_bytes} {k}")
        tables = a.reader.tables
        if hot_bytes == 3000:  # coded, part of the shards held: filled chunk by chunk
            assert tables["action"].code is not None and not tables["action"].holds_whole
            assert (tables["action"].slot >= 0).any()
            assert tables["reward"].fds.held is not None  # compressed chunks held
        if hot_bytes == 9000:
            assert tables["reward"].code is not None and a.reader.held_whole["reward"]
        a.close()
        b.close()
