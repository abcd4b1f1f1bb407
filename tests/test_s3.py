"""expstore on a real S3-protocol server (moto's server mode, a subprocess on loopback).

Every row is checked byte for byte against what its writer wrote (``testing.data``).
Server outages are made with a TCP proxy in front of moto (``testing.s3.TcpProxy``): the
endpoint refuses connections and resets open ones, then comes back on the same port.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest
import zarr
from _object_store_cases import fenced_takeover, write

import expstore as es
from expstore.errors import PreconditionFailed
from expstore.storage import LaneState, read_state, state_key
from expstore.storage.backends import RetryPolicy, S3Backend  # the backends subpackage's face
from expstore.testing import data

pytest.importorskip("s3fs")

SPEC = data.spec()


def all_objects(backend, skip=(".lease",)) -> dict[str, bytes]:
    keys = [k for k in backend.list("") if not k.endswith(skip)
            and not os.path.basename(k).startswith(".")]
    return dict(zip(keys, backend.get_many(keys)))


def test_create_append_flush_reopen_sample(s3_url):
    url, so = s3_url
    store = es.create(url, SPEC, capacity=96, shard_rows=32, storage_options=so)
    assert isinstance(store.backend, S3Backend) and store.backend.pins_versions
    nxt = write(store, 0, 0, 130, session=1)  # wraps the 96-row ring
    store.flush()
    store.close()

    r = es.open(url, storage_options=so)
    assert int(r.index.count[0]) == nxt and len(r) <= 96
    assert data.check_lane(r, 0) == len(r)  # every intact row, every field, every byte
    for _ in range(3):
        data.check_batch(r.sample(64), r.index)

    w = es.open(url, mode="r+", storage_options=so)  # continue where the store ended
    end = write(w, 0, nxt, 30, session=2)
    w.close()
    r.refresh()
    assert int(r.index.count[0]) == end
    data.check_lane(r, 0, starts={nxt})
    data.check_batch(r.sample(64), r.index)

    # plain zarr (its FsspecStore on s3fs) reads every field back
    z = zarr.open_group(url, mode="r", storage_options=so)
    steps = np.arange(int(r.index.lower_bound()[0]), end)
    rows = r.index.lane_rows(0, steps)
    for name in r.layout.fields:
        assert np.array_equal(z[name][:][rows], r.read(name, rows, steps)), name
    assert z.attrs["expstore"]["capacity"] == 96


def test_s3_store_equals_local_store_object_for_object(s3_url, tmp_path):
    url, so = s3_url
    local = tmp_path / "local.zarr"
    stores = [es.create(u, SPEC, capacity=128, lanes=2, shard_rows=16, storage_options=o)
              for u, o in ((url, so), (local, None))]
    for st in stores:
        a = write(st, 0, 0, 90, session=1, per=23, flush=True)  # lane 0 wraps its 64 rows
        b = write(st, 1, 0, 30, session=1, per=9)
        st.close()
    s3_objs = all_objects(es.open(url, storage_options=so).backend)
    local_objs = all_objects(es.open(local).backend)
    assert sorted(s3_objs) == sorted(local_objs)
    for key, raw in local_objs.items():
        if key.startswith("_state/lane_"):  # S3 counts the fencing bump of the one open
            s3_st, local_st = (LaneState.decode(r, key) for r in (s3_objs[key], raw))
            assert s3_st.generation == local_st.generation + 1, key
            s3_st.generation -= 1
            assert s3_st.encode() == raw, key
            continue
        assert s3_objs[key] == raw, key  # shards and metadata, byte for byte
    zs, zl = (zarr.open_group(url, mode="r", storage_options=so),
              zarr.open_group(local, mode="r"))
    for name in stores[1].layout.fields:
        assert np.array_equal(zs[name][:], zl[name][:]), name
    r = es.open(url, storage_options=so)
    assert r.index.count.tolist() == [a, b]
    data.check_lane(r, 0)
    data.check_lane(r, 1)


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


def test_replaced_shard_is_never_read_as_the_old_version(s3_url):
    """A reader whose cached index predates a wrap-around must not return the new lap's
    bytes for the old steps: S3 range GETs carry If-Match and the rows come back stale.
    (No frame cache here: a cached frame is the old step's own, see
    test_frames_cached_before_a_wrap_are_the_old_steps_own.)"""
    url, so = s3_url
    store = es.create(url, SPEC, capacity=64, shard_rows=16, storage_options=so)
    nxt = write(store, 0, 0, 40, session=1)
    store.flush()
    r = es.open(url, storage_options=so, cache_bytes=0)
    old_steps = np.arange(0, 16)
    rows = r.index.lane_rows(0, old_steps)
    buf = np.empty((16, *SPEC.fields["obs.pixels"].shape), np.uint8)
    assert r.reader.read("obs.pixels", rows, old_steps, buf).all()  # caches shard 0's head
    write(store, 0, nxt, 60, session=1)  # the ring wraps: shard 0 now holds a new lap
    store.flush()
    ok = r.reader.read("obs.pixels", rows, old_steps, buf)
    assert not ok.any()  # reported overwritten, not served from the new object
    # rows of a partly written shard that grew meanwhile still read correctly
    r.refresh()
    cur = int(r.index.count[0])
    steps = np.arange(cur - cur % 16, cur)
    rows = r.index.lane_rows(0, steps)
    got = np.empty((len(rows), *buf.shape[1:]), np.uint8)
    assert r.reader.read("obs.pixels", rows, steps, got).all()
    assert np.array_equal(data.frame_header(got)[0], steps)


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


def test_writes_ride_through_an_endpoint_restart(s3_url, s3_server, s3_proxy):
    url, _ = s3_url
    so = s3_proxy.storage_options
    store = es.create(url, SPEC, capacity=2048, shard_rows=16, storage_options=so)
    store.backend.retry = RetryPolicy(attempts=60, base=0.05, max_delay=0.3, deadline=30)
    cut = threading.Timer(0.4, s3_proxy.cut)
    back = threading.Timer(2.4, s3_proxy.restore)
    cut.start()
    back.start()
    nxt, flushes, after = 0, 0, 0
    while after < 3:  # writing and flushing all through the outage, and 3 flushes after
        nxt = write(store, 0, nxt, 10, session=1, per=10)
        store.flush()
        flushes += 1
        after += s3_proxy._up and not back.is_alive()
    back.join()
    assert store.backend.requests["retried"] > 0, "the outage did not hit a request"
    store.close()
    direct = s3_server.storage_options  # check on moto itself, not through the proxy
    r = es.open(url, storage_options=direct)
    assert int(r.index.count[0]) == nxt >= 10 * flushes and flushes >= 4
    data.check_lane(r, 0)
    data.check_batch(r.sample(64), r.index)


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


def _kill_target(url: str, so: dict, ready) -> None:
    store = es.open(url, mode="r+", storage_options=so)
    nxt = int(store.index.count[0])
    ready.set()
    while True:
        nxt = write(store, 0, nxt, 12, session=2, per=12)
        store.flush()


def test_writer_killed_mid_write_reopens_at_last_commit(s3_url):
    url, so = s3_url
    store = es.create(url, SPEC, capacity=4096, shard_rows=16, storage_options=so)
    start = write(store, 0, 0, 30, session=1)
    store.close()
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_kill_target, args=(url, so, ready), daemon=True)
    p.start()
    assert ready.wait(60)
    time.sleep(1.0)  # several flushes, then die in the middle of whatever it was doing
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    r = es.open(url, storage_options=so)
    assert int(r.index.count[0]) > start
    data.check_lane(r, 0, starts={start})  # every committed row exact, nothing torn
    # the dead writer's lease does not block a new writer on this machine
    w = es.open(url, mode="r+", storage_options=so)
    write(w, 0, int(w.index.count[0]), 10, session=3)
    w.close()


@pytest.mark.parametrize("point", ["commit.shards", "commit.state"])
def test_a_writer_that_lost_its_lane_commits_nothing(s3_url, point):
    """Fencing: paused between its ownership check and its shard uploads / lane state PUT
    while another process takes the lane over, the old owner fails with a lease-lost error
    and overwrites nothing of the new owner's."""
    fenced_takeover(*s3_url, point)


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
    assert b.get("_state/x.lease") == b"c" and b.atomic_conditional_writes
