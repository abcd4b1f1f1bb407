"""expstore on a real S3-protocol server (moto's server mode, a subprocess on loopback).

The store-level cases every object store runs (``tests/_object_store_cases.py``: round
trip, object-for-object equality with a local store, loader workers, many writers, lease
races, fencing, version pins, outages, a killed writer) run in :class:`TestStoreOnMoto`;
the functions below are what only S3 checks. Every row is checked byte for byte against
what its writer wrote (``testing.data``). Server outages are made with a TCP proxy in front
of moto (``testing.s3.TcpProxy``): the endpoint refuses connections and resets open ones,
then comes back on the same port.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import zarr
from _object_store_cases import SPEC, ObjectStoreCases, write

import expstore as es
from expstore.errors import PreconditionFailed
from expstore.storage.backends import RetryPolicy, S3Backend  # the backends subpackage's face
from expstore.storage.format import read_state, state_key
from expstore.testing import data
from expstore.testing.s3 import s3_options

pytest.importorskip("s3fs")


class TestStoreOnMoto(ObjectStoreCases):
    backend_cls = S3Backend
    atomic = True
    remote_fixture, server_fixture = "s3_url", "s3_server"
    options = staticmethod(s3_options)


def test_a_new_shard_is_opened_for_every_field_in_one_round_trip(s3_url):
    """A learner meets a shard a writer just committed: its headers for every field read so
    far come in one batched request set, not one round trip per field."""
    url, so = s3_url
    w = es.create(url, SPEC, capacity=640, shard_rows=64, storage_options=so)
    nxt = write(w, 0, 0, 60, session=1)
    w.flush()
    r = es.open(url, storage_options=so)
    names = list(r.layout.fields)
    rows = np.arange(0, 32)
    for name in names:  # every field read once (shard 0)
        r.read(name, rows, rows)
    while nxt < 64 + 40:  # the writer moves on into shard 1
        nxt = write(w, 0, nxt, 20, session=1)
    w.flush()
    calls = []
    orig = r.backend.read_ranges

    def spy(requests, missing_ok=False):
        calls.append(len(requests))
        return orig(requests, missing_ok)

    r.backend.read_ranges = spy
    r.refresh()  # (reads the new rows' flags: shard 1 is opened here)
    steps = np.arange(64, 96)
    for name in names:
        r.read(name, steps, steps)
    assert calls[0] >= len(names), calls  # every field's header in one request set
    assert len(calls) <= 4, calls  # heads, then data of the fields the heads did not bring
    data.check_lane(r, 0)
    w.close()


def test_warm_batch_costs_one_ranged_get_per_shard_touched(s3_url, s3_proxy):
    url, _ = s3_url
    so = s3_proxy.storage_options  # every request goes through the counting proxy
    store = es.create(url, SPEC, capacity=640, shard_rows=64, storage_options=so)
    write(store, 0, 0, 560, session=1, per=100)
    store.close()
    r = es.open(url, storage_options=so, cache_bytes=0)  # requests, not the frame cache
    sampler = es.UniformSampler(r, seed=0, refresh_every=None)  # (no lane state GETs)
    touched: list[tuple[str, int]] = []
    reader = r.reader
    orig = reader.read

    def spy(name, rows, steps, out):
        touched.extend((name, int(s)) for s in np.unique(rows // r.layout.shard_rows))
        return orig(name, rows, steps, out)

    reader.read = spy
    counts = []
    for i in range(6):
        if i == 1:
            sampler.sample(512)  # warm up: every shard's header and scalar chunks cached
        touched.clear()
        s3_proxy.reset_count()
        before = r.backend.requests["range_get"]
        batch = sampler.sample(32)
        http = s3_proxy.reset_count()
        assert http == r.backend.requests["range_get"] - before  # our counter is honest
        data.check_batch(batch, r.index)
        pixel_shards = {s for n, s in touched if n == "obs.pixels"}
        if i == 0:  # cold: one header GET + one data GET per shard object, no more
            assert http <= 2 * len(set(touched))
            continue
        # warm: headers cached, scalar chunks cached, one coalesced GET per frame shard
        assert http == len(pixel_shards) <= len(set(touched))
        counts.append(http)
    assert max(counts) < 32 * 2  # far below one request per frame read (64 frames)


def test_frames_cached_before_a_wrap_are_the_old_steps_own(s3_url):
    """With the frame cache, a reader whose index predates a wrap-around may serve old steps
    from frames it decoded before the wrap: they are those steps' own bytes, never the new
    lap's."""
    url, so = s3_url
    store = es.create(url, SPEC, capacity=64, shard_rows=16, storage_options=so)
    nxt = write(store, 0, 0, 40, session=1)
    store.flush()
    r = es.open(url, storage_options=so)
    old_steps = np.arange(0, 16)
    rows = r.index.lane_rows(0, old_steps)
    buf = np.empty((16, *SPEC.fields["obs.pixels"].shape), np.uint8)
    assert r.reader.read("obs.pixels", rows, old_steps, buf).all()
    write(store, 0, nxt, 60, session=1)  # the ring wraps: shard 0 now holds a new lap
    store.flush()
    buf[:] = 0
    ok = r.reader.read("obs.pixels", rows, old_steps, buf)
    assert np.array_equal(data.frame_header(buf[ok])[0], old_steps[ok])
    store.close()


def test_permanent_outage_fails_clearly_and_loses_nothing(s3_url, s3_server, s3_proxy):
    url, _ = s3_url
    direct = s3_server.storage_options
    store = es.create(url, SPEC, capacity=256, shard_rows=16,
                      storage_options=s3_proxy.storage_options)
    store.backend.retry = RetryPolicy(attempts=3, base=0.05, deadline=5)
    nxt = write(store, 0, 0, 40, session=1)
    store.flush()
    witness = S3Backend(url, direct)
    state_before = witness.get(state_key(0))
    committed = read_state(witness, 0).count
    s3_proxy.cut()
    more = write(store, 0, nxt, 5, session=1)  # staged only (shard not full)
    with pytest.raises(es.StorageError, match=r"s3://.*/(obs\.pixels|obs\.vec|action|reward|"
                       r"terminated|truncated|session|_\w+)/c/\d.*failed after 3 attempt"):
        store.flush()
    assert witness.get(state_key(0)) == state_before  # the commit point did not move
    r = es.open(url, storage_options=direct)  # reopens with the last committed state
    assert int(r.index.count[0]) == committed == nxt
    data.check_lane(r, 0)
    s3_proxy.restore()
    store.flush()  # the endpoint is back: the staged rows were kept and now commit
    r.refresh()
    assert int(r.index.count[0]) == more
    data.check_lane(r, 0)
    store.close()


def test_memory_and_file_urls(tmp_path):
    for url in ("memory://expstore-test/s.zarr", f"file://{tmp_path}/s.zarr"):
        store = es.create(url, SPEC, capacity=64, shard_rows=16, overwrite=True)
        nxt = write(store, 0, 0, 90, session=1)
        store.close()
        r = es.open(url)
        assert int(r.index.count[0]) == nxt
        data.check_lane(r, 0)
        data.check_batch(r.sample(32), r.index)
        z = zarr.open_group(url, mode="r")
        assert z["_step_id"][:].max() == nxt - 1


def test_memory_reader_rechecks_headers_after_wraparound():
    """memory:// cannot pin versions: the reader re-reads headers after the data instead."""
    url = "memory://expstore-test/recheck.zarr"
    store = es.create(url, SPEC, capacity=64, shard_rows=16, overwrite=True)
    nxt = write(store, 0, 0, 40, session=1)
    store.flush()
    other = es.open(url)
    assert not other.backend.pins_versions
    steps = np.arange(16)
    rows = other.index.lane_rows(0, steps)
    buf = np.empty((16, *SPEC.fields["obs.pixels"].shape), np.uint8)
    assert other.reader.read("obs.pixels", rows, steps, buf).all()
    write(store, 0, nxt, 60, session=1)
    store.flush()
    assert not other.reader.read("obs.pixels", rows, steps, buf).any()


def test_permanent_error_is_not_retried(s3_server):
    store_url = "s3://no-such-bucket-expstore/s.zarr"
    b = S3Backend(store_url, s3_server.storage_options)
    t0 = time.monotonic()
    with pytest.raises(es.StorageError, match="no-such-bucket-expstore/s.zarr/x.*permanent"):
        b.put("x", b"1")
    assert time.monotonic() - t0 < 2 and b.requests["retried"] == 0


def test_conditional_writes_are_decided_by_the_server(s3_url, monkeypatch):
    """Lease writes use S3 If-None-Match / If-Match: the server refuses a stale write even
    when a client-side check would have been fooled (no check-then-write window)."""
    url, so = s3_url
    b = S3Backend(url, so)
    tag = b.put_if("_state/x.lease", b"a", None)
    with pytest.raises(PreconditionFailed):
        b.put_if("_state/x.lease", b"b", None)  # exists already
    b.put("_state/x.lease", b"c")  # another writer replaces it
    monkeypatch.setattr(S3Backend, "get_tagged", lambda self, key: (b"a", tag))
    with pytest.raises(PreconditionFailed):
        b.put_if("_state/x.lease", b"d", tag)  # stale tag: refused by the server
    monkeypatch.undo()
    assert b.get("_state/x.lease") == b"c" and b.atomic_conditional_writes and b.pins_versions
