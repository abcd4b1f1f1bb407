"""Object storage with latency: the latency proxy, the local shard cache and concurrent
flush uploads, against a real moto server on loopback behind ``LatencyProxy``.

Every row read back is checked byte for byte against what its writer wrote
(``testing.data``); request counts are HTTP requests seen on the wire by the proxy.
"""

from __future__ import annotations

import os
import time
import urllib.request

import numpy as np
import pytest

import expstore as es
from expstore.storage.backends import backend_for
from expstore.storage.backends.shard_cache import ShardCache
from expstore.testing import data
from expstore.testing.latency_proxy import LatencyProxy

pytest.importorskip("s3fs")

SPEC = data.spec()
DELAY = 0.05


@pytest.fixture
def slow_s3(s3_server, s3_url):
    """A fresh bucket reached through a 50 ms-per-request proxy: (url, options, proxy)."""
    url, _ = s3_url
    proxy = LatencyProxy(s3_server.port, delay=DELAY, lifetime=300).start()
    try:
        yield url, proxy.storage_options, proxy
    finally:
        proxy.stop()


def fill(url: str, so: dict, steps: int, shard_rows: int = 32, lanes: int = 1) -> es.Store:
    store = es.create(url, SPEC, capacity=steps * 2, shard_rows=shard_rows, lanes=lanes,
                      storage_options=so)
    for lane in range(lanes):
        nxt = 0
        while nxt < steps:
            batch, nxt = data.make_steps(lane, nxt, min(50, steps - nxt), session=1)
            store.extend(batch, lane=lane)
    store.flush()
    return store


# -- the proxy ----------------------------------------------------------------------------
def test_proxy_delays_every_request_and_counts_them(s3_server):
    with LatencyProxy(s3_server.port, delay=0.1) as proxy:
        t0 = time.perf_counter()
        for _ in range(3):
            try:
                urllib.request.urlopen(proxy.endpoint + "/", timeout=10).read()
            except urllib.error.HTTPError:
                pass
        dt = time.perf_counter() - t0
        assert proxy.requests == 3 and proxy.delayed == 3
        assert dt >= 3 * 0.1
        assert proxy.stats()["bytes_down"] > 0 and proxy.stats()["bytes_up"] > 0


def test_proxy_stops_by_itself_and_refuses_bad_delays(s3_server):
    proxy = LatencyProxy(s3_server.port, delay=0.0, lifetime=0.3).start()
    urllib.request.urlopen(proxy.endpoint + "/", timeout=10).read()
    time.sleep(0.8)
    with pytest.raises(OSError):
        urllib.request.urlopen(proxy.endpoint + "/", timeout=2).read()
    with pytest.raises(ValueError, match="delay"):
        LatencyProxy(s3_server.port, delay=-1)


# -- concurrent uploads -------------------------------------------------------------------
@pytest.mark.slow  # ~7 s behind a slow endpoint
def test_flush_uploads_a_shards_objects_concurrently(slow_s3):
    """A flush of one shard writes one object per field (10 here: 7 fields, 3 row arrays)
    and a lane state. Uploaded one at a time (``max_uploads=1``) that is 10 request delays
    before the state; concurrently, one."""
    url, so, proxy = slow_s3
    store = es.create(url, SPEC, capacity=512, shard_rows=64, storage_options=so)
    n_objects = len(store.layout.fields)
    assert n_objects >= 6
    times = {}
    nxt = 0
    for uploads in (1, 16, 1, 16):
        store.backend.max_uploads = uploads
        batch, nxt = data.make_steps(0, nxt, 40, session=1)
        store.extend(batch)
        proxy.reset_count()
        t0 = time.perf_counter()
        store.flush()
        times.setdefault(uploads, []).append(time.perf_counter() - t0)
        assert proxy.requests >= n_objects + 1  # every object and the state went out
    one_by_one, together = min(times[1]), min(times[16])
    assert one_by_one >= n_objects * DELAY
    assert together < one_by_one - (n_objects - 2) * DELAY, times
    store.close()
    r = es.open(url, storage_options=so)
    assert data.check_lane(r, 0) == nxt


def test_put_many_writes_every_object_and_reports_a_failure(s3_url):
    url, so = s3_url
    b = backend_for(url, so)
    items = [(f"k/{i}", bytes([i]) * (100 + i)) for i in range(20)]
    b.put_many(items)
    assert b.get_many([k for k, _ in items]) == [d for _, d in items]
    bad = backend_for("s3://no-such-bucket-here/x", so)
    with pytest.raises(OSError, match="no-such-bucket-here"):
        bad.put_many(items[:3])


# -- the shard cache ----------------------------------------------------------------------
def read_all(store: es.Store) -> int:
    """Check every committed row of lane 0 byte for byte; the rows checked."""
    n = data.check_lane(store, 0)
    assert n == len(store) > 0
    return n


@pytest.mark.slow  # ~10 s behind a slow endpoint
def test_shard_cache_serves_hot_shards_without_requests(slow_s3, tmp_path):
    url, so, proxy = slow_s3
    fill(url, so, 300).close()
    cache = {"path": str(tmp_path / "cache"), "max_bytes": 64 << 20}
    cso = {**so, "shard_cache": cache}

    proxy.reset_count()
    cold = es.open(url, storage_options=cso)
    assert isinstance(cold.reader.backend, ShardCache)
    read_all(cold)
    cold_requests = proxy.reset_count()
    fetched = cold.reader.backend.stats["fetches"]
    assert fetched > 0 and os.listdir(cache["path"])
    # the same reader again: every handle bound to a cached copy, no request at all
    read_all(cold)
    assert proxy.reset_count() == 0
    cold.close()

    # a new reader (another process, a restart): one small head check per shard object,
    # never the whole object again
    warm = es.open(url, storage_options=cso)
    proxy.reset_count()
    before = proxy.stats()["bytes_down"]
    read_all(warm)
    warm_stats = warm.reader.backend.stats
    assert warm_stats["fetches"] == 0 and warm_stats["hits"] > 0
    nbytes = proxy.stats()["bytes_down"] - before
    cached = sum(os.path.getsize(os.path.join(cache["path"], f))
                 for f in os.listdir(cache["path"]))
    assert nbytes < cached  # heads only (and small scalar shards, read whole anyway)
    warm.close()

    # without the cache, the same reader's second pass requests the frames again
    plain = es.open(url, storage_options=so, cache_bytes=0)  # no frame cache either
    read_all(plain)
    proxy.reset_count()
    read_all(plain)
    assert proxy.reset_count() > 0 < cold_requests
    plain.close()


def test_shard_cache_notices_a_rewritten_shard(s3_url, tmp_path):
    """A cached copy whose shard was rewritten since (the writer went on) is not served:
    the head check sees the new version and the new bytes are fetched."""
    url, so = s3_url
    w = es.create(url, SPEC, capacity=128, shard_rows=64, storage_options=so)
    batch, nxt = data.make_steps(0, 0, 20, session=1)
    w.extend(batch)
    w.flush()
    cso = {**so, "shard_cache": str(tmp_path / "c")}
    r = es.open(url, storage_options=cso)
    first = read_all(r)
    r.close()
    batch, nxt = data.make_steps(0, nxt, 30, session=1)  # same shard, rewritten longer
    w.extend(batch)
    w.flush()
    r = es.open(url, storage_options=cso)
    assert data.check_lane(r, 0) == len(r) == nxt > first
    assert r.reader.backend.stats["fetches"] > 0
    r.close()
    w.close()


@pytest.mark.slow  # ~10 s behind a slow endpoint
def test_shard_cache_stays_within_its_bound(slow_s3, tmp_path):
    url, so, _ = slow_s3
    fill(url, so, 600).close()
    path = tmp_path / "small"
    store = es.open(url, storage_options={**so, "shard_cache": {
        "path": str(path), "max_bytes": 40_000, "max_object_bytes": 20_000}})
    read_all(store)
    read_all(store)
    total = sum(os.path.getsize(path / f) for f in os.listdir(path))
    assert 0 < total <= 40_000
    assert store.reader.backend.stats["evicted"] > 0
    store.close()


def test_shard_cache_bad_options_name_the_field(s3_url, tmp_path):
    url, so = s3_url
    with pytest.raises(ValueError, match="shard_cache.*max_bytes"):
        backend_for(url, {**so, "shard_cache": {"path": str(tmp_path), "max_bytes": 0}})
    with pytest.raises(ValueError, match="shard_cache.*unknown keys.*size"):
        backend_for(url, {**so, "shard_cache": {"path": str(tmp_path), "size": 1}})
    with pytest.raises(ValueError, match="shard_cache: expected a folder path"):
        backend_for(url, {**so, "shard_cache": 5})


@pytest.mark.slow  # ~8 s behind a slow endpoint
def test_loader_workers_read_through_the_cache(slow_s3, tmp_path):
    """DataLoader workers build their backends from the store's storage options: with a
    shard cache they share its folder, and their batches are the committed rows."""
    url, so, proxy = slow_s3
    fill(url, so, 200).close()
    cso = {**so, "shard_cache": str(tmp_path / "c")}
    store = es.open(url, storage_options=cso)
    loader = es.make_loader(store, batch_size=16, num_workers=2, num_batches=20)
    n = 0
    for batch in loader:
        b = {k: np.asarray(v) for k, v in batch.items()}
        n += data.check_batch(b, store.index)
    loader.close()
    assert n == 20 * 16
    assert os.listdir(tmp_path / "c")
    store.close()


TAKE_OVER = """
import json, sys, time
_now = time.time
time.time = lambda: _now() + 1000.0  # this host's clock runs ahead: the lease looks expired
import expstore as es
from expstore.testing import data
so = json.loads(sys.argv[2])
with es.open(sys.argv[1], "r+", storage_options=so) as s:
    batch, nxt = data.make_steps(0, int(s.index.count[0]), 10, session=2)
    s.extend(batch)
    print(int(s.index.count[0]))
"""


def test_concurrent_uploads_never_overwrite_a_new_lease_owner(s3_url):
    """The ownership check still comes before a flush's concurrent uploads: a writer whose
    lease another host took over fails its flush without writing a shard object."""
    import json
    import subprocess
    import sys

    url, so = s3_url
    first = es.create(url, SPEC, capacity=256, shard_rows=64, storage_options=so)
    batch, nxt = data.make_steps(0, 0, 20, session=1)
    first.extend(batch)
    first.flush()  # the lease was just renewed: no renewal for ttl/3
    out = subprocess.run([sys.executable, "-c", TAKE_OVER, url, json.dumps(so)],
                         capture_output=True, text=True, timeout=120, check=True)
    taken = int(out.stdout.split()[-1])
    shard_key = first.layout.shard_key("obs.pixels", 0)
    theirs = first.backend.get(shard_key)
    batch, _ = data.make_steps(0, nxt, 5, session=1)
    first.extend(batch)
    with pytest.raises(es.StoreLockedError, match="lost its lease"):
        first.flush()
    assert first.backend.get(shard_key) == theirs  # not one object overwritten
    with pytest.raises(es.StoreLockedError):
        first.close()
    r = es.open(url, storage_options=so)
    assert int(r.index.count[0]) == taken
    assert data.check_lane(r, 0, starts={nxt}) == taken
    r.close()
