"""Store-level cases every object-store backend runs against its real local server
(``tests/test_s3.py``, ``tests/test_gcs.py``, ``tests/test_azure.py``).

A subclass of :class:`ObjectStoreCases` provides ``remote`` (``(url, storage_options)`` of a
fresh bucket), ``server`` (the session's server, with ``port``), ``options_for(endpoint)``
and says whether the server honours preconditions (``atomic``). Every row is checked byte
for byte against what its writer wrote (``expstore.testing.data``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import zarr

import expstore as es
from expstore.errors import LeaseUnsupportedError
from expstore.storage import faults
from expstore.storage.backends import Backend, RetryPolicy, backend_for
from expstore.storage.format import LaneState, read_state, state_key
from expstore.storage.ownership import lease_key
from expstore.testing import TcpProxy, data

SPEC = data.spec()
CTX = mp.get_context("fork")


def write(store, lane: int, start: int, steps: int, session: int, per: int = 20,
          flush: bool = False) -> int:
    """``steps`` deterministic steps into ``lane`` from step ``start``; the next step."""
    nxt = start
    while steps > 0:
        batch, nxt = data.make_steps(lane, nxt, min(per, steps), session)
        store.extend(batch, lane=lane)
        steps -= per
        if flush:
            store.flush()
    return nxt


def _race(url: str, so: dict, barrier: Any, out: Any, done: Any) -> None:
    """One racer: opens lane 0 for writing at the barrier, reports, holds it until ``done``."""
    try:
        barrier.wait(60)
        store = es.open(url, mode="r+", lane=0, storage_options=so)
    except es.StoreLockedError:
        out.put("locked")
        return
    except LeaseUnsupportedError:
        out.put("unsupported")
        return
    except BaseException as e:  # reported, so the parent fails with the reason
        out.put(f"error: {e!r}")
        return
    out.put("won")
    done.wait(120)
    store.close()


def _lane_writer(url: str, so: dict, lane: int, steps: int, out: Any, kw: dict) -> None:
    try:
        store = es.open(url, mode="r+", lane=lane, storage_options=so, **kw)
        nxt = write(store, lane, 0, steps, session=1, per=15, flush=True)
        store.close()
        out.put((lane, nxt))
    except BaseException as e:
        out.put((lane, repr(e)))


def _kill_target(url: str, so: dict, ready: Any) -> None:
    store = es.open(url, mode="r+", storage_options=so)
    nxt = int(store.index.count[0])
    ready.set()
    while True:
        nxt = write(store, 0, nxt, 12, session=2, per=12)
        store.flush()


def _take_over(url: str, so: dict, out: Any) -> None:
    """The new owner: opens lane 0 (the old owner's lease expired), writes 20 rows into the
    shard the old owner is still writing, flushes, closes; reports ``(start, end)``."""
    try:
        store = es.open(url, mode="r+", lane=0, storage_options=so)
        start = int(store.index.count[0])
        end = write(store, 0, start, 20, session=2)
        store.close()
        out.put((start, end))
    except BaseException as e:
        out.put(repr(e))


def fenced_takeover(url: str, so: dict, point: str) -> None:
    """The old owner of lane 0 pauses at ``point`` (``commit.shards``: it checked the lane is
    its own, shard uploads next; ``commit.state``: shards uploaded, lane state PUT next); its
    lease expires, another process takes the lane over and commits rows into the same shard;
    the old owner resumes. It must fail with a lease-lost error, writing nothing over the
    new owner's objects: every row the new owner committed reads back, the store opens."""
    ttl = 2.0
    store = es.create(url, SPEC, capacity=256, shard_rows=64, storage_options=so,
                      lease_ttl=ttl)
    mine = write(store, 0, 0, 40, session=1)
    store.flush()  # rows 0..40 committed: the first shard, partly
    write(store, 0, mine, 10, session=1)  # rows 40..50 staged in that shard
    paused, resume, failed = threading.Event(), threading.Event(), []

    def flush() -> None:
        try:
            store.flush()
        except BaseException as e:  # the old owner's outcome, checked below
            failed.append(e)

    faults.arm(point, notify=lambda _: paused.set(), resume=resume)
    old = threading.Thread(target=flush)
    old.start()
    try:
        assert paused.wait(60), f"the old owner never reached {point}"
        faults.arm(None)  # (the new owner, a fork, must not pause)
        time.sleep(ttl + 0.5)  # the old owner's lease expires
        out = CTX.Queue()
        p = CTX.Process(target=_take_over, args=(url, so, out))
        p.start()
        got = out.get(timeout=120)
        p.join(30)
        assert isinstance(got, tuple) and got[0] == mine, got
        theirs = got[1]
    finally:
        resume.set()
        old.join(60)
        faults.arm(None)
    assert len(failed) == 1 and isinstance(failed[0], es.StoreLockedError), failed
    assert "lost its lease" in str(failed[0]), failed[0]
    try:
        store.close()
    except es.StoreLockedError:
        pass  # (its rows were not committed: said again)

    r = es.open(url, storage_options=so)
    assert int(r.index.count[0]) == theirs
    sessions = lambda lane, steps: np.where(steps < mine, 1, 2)  # noqa: E731
    assert data.check_lane(r, 0, sessions, starts={mine}) == theirs
    r.close()
    w = es.open(url, mode="r+", lane=0, storage_options=so)  # writable: the lease is free
    end = write(w, 0, theirs, 5, session=3)
    w.close()
    assert int(es.open(url, storage_options=so).index.count[0]) == end


class ObjectStoreCases:
    """expstore stores on one object-store server; see the module doc."""

    #: the backend class ``backend_for`` gives for the URL
    backend_cls: type[Backend]
    #: the server honours conditional writes (else leases are refused)
    atomic: bool = True
    #: racers per round and rounds of the lease race
    racers: int = 4
    race_rounds: int = 3
    #: DataLoader worker start methods to test
    loader_methods: tuple[str, ...] = ("fork", "spawn")

    #: names of the fixtures giving a fresh store URL ``(url, storage_options)`` on the
    #: server, and the server (its ``endpoint``)
    remote_fixture: str
    server_fixture: str
    #: endpoint -> the storage options of a client of that endpoint
    options: Callable[[str], dict]

    @pytest.fixture
    def remote(self, request) -> tuple[str, dict]:
        return request.getfixturevalue(self.remote_fixture)

    @pytest.fixture
    def server(self, request) -> Any:
        return request.getfixturevalue(self.server_fixture)

    def options_for(self, endpoint: str) -> dict:
        return type(self).options(endpoint)

    def _lease_ttl(self) -> dict:
        return {} if self.atomic else {"lease_ttl": None}

    # -- a store round trip ---------------------------------------------------------------
    def test_create_append_reopen_sample(self, remote):
        url, so = remote
        store = es.create(url, SPEC, capacity=96, shard_rows=32, storage_options=so,
                          **self._lease_ttl())
        assert type(store.backend) is self.backend_cls
        assert store.backend.atomic_conditional_writes is self.atomic
        nxt = write(store, 0, 0, 130, session=1)  # wraps the 96-row ring
        store.flush()
        store.close()

        r = es.open(url, storage_options=so)
        assert int(r.index.count[0]) == nxt and len(r) <= 96
        assert data.check_lane(r, 0) == len(r)  # every intact row, every field, every byte
        for _ in range(3):
            data.check_batch(r.sample(64), r.index)
        sampler = es.PrioritizedSampler(r, seed=1)
        data.check_batch(sampler.sample(32), r.index)

        w = es.open(url, mode="r+", storage_options=so, **self._lease_ttl())
        end = write(w, 0, nxt, 30, session=2)
        w.close()
        r.refresh()
        assert int(r.index.count[0]) == end
        data.check_lane(r, 0, starts={nxt})
        data.check_batch(r.sample(64), r.index)

        z = zarr.open_group(url, mode="r", storage_options=so)  # plain zarr reads it too
        steps = np.arange(int(r.index.lower_bound()[0]), end)
        rows = r.index.lane_rows(0, steps)
        for name in r.layout.fields:
            assert np.array_equal(z[name][:][rows], r.read(name, rows, steps)), name

    def test_store_equals_a_local_store_object_for_object(self, remote, tmp_path,
                                                           monkeypatch):
        import expstore.api

        url, so = remote
        local = tmp_path / "local.zarr"
        # (one id for both: it is in zarr.json and the index snapshot blocks' headers)
        monkeypatch.setattr(expstore.api, "new_store_id", lambda: "0" * 32)
        for u, o, kw in ((url, so, self._lease_ttl()), (local, None, {})):
            st = es.create(u, SPEC, capacity=128, lanes=2, shard_rows=16, storage_options=o,
                           **kw)
            write(st, 0, 0, 90, session=1, per=23, flush=True)
            write(st, 1, 0, 30, session=1, per=9)
            st.close()
        remote_b, local_b = backend_for(url, so), backend_for(local)
        keys = [k for k in local_b.list("") if not k.endswith(".lease")]
        assert [k for k in remote_b.list("") if not k.endswith(".lease")] == keys
        bumps = 1 if self.atomic else 0  # the fencing bump of the one open for writing
        for key, raw in zip(keys, local_b.get_many(keys)):
            got = remote_b.get(key)
            if key.startswith("_state/lane_"):
                st = LaneState.decode(got, key)
                assert st.generation == LaneState.decode(raw, key).generation + bumps, key
                st.generation -= bumps
                got = st.encode()
            assert got == raw, key  # shards, state files, metadata

    @pytest.mark.parametrize("method", ["fork", "spawn"])
    def test_loader_workers_read_the_store(self, remote, method):
        """DataLoader workers (forked: the parent's filesystem objects are re-created;
        spawned: a fresh process) read PER batches; priorities go back to the sampler."""
        if method not in self.loader_methods:
            pytest.skip(f"{method} workers are covered on the other servers (time)")
        url, so = remote
        store = es.create(url, SPEC, capacity=256, lanes=2, shard_rows=32,
                          storage_options=so, **self._lease_ttl())
        for lane in (0, 1):
            write(store, lane, 0, 100, session=1, per=25)
        store.flush()
        sampler = es.PrioritizedSampler(store, seed=3)
        loader = es.make_loader(store, sampler, batch_size=16, num_workers=2,
                                multiprocessing_context=method, num_batches=6,
                                persistent_workers=False, timeout=120)
        lanes = set()
        for batch in loader:
            got = {k: v.numpy() for k, v in batch.items()}
            assert data.check_batch(got, store.index) == 16
            lanes.update((got["index"] // store.index.lane_capacity).tolist())
            sampler.update_priorities(got["index"], np.full(16, 5.0))
        assert loader.stats.batches == 6 and lanes == {0, 1}
        store.close()

    # -- many writers ---------------------------------------------------------------------
    def test_two_writers_on_two_lanes(self, remote):
        """Two processes, one lane each, with leases (or, where the server ignores
        preconditions, with ``lease_ttl=None``: the user keeps one writer per lane)."""
        url, so = remote
        kw = self._lease_ttl()
        es.create(url, SPEC, capacity=256, lanes=2, shard_rows=16, storage_options=so,
                  **kw).close()
        out = CTX.Queue()
        procs = [CTX.Process(target=_lane_writer,
                             args=(url, so, lane, 70 + 20 * lane, out, kw))
                 for lane in (0, 1)]
        for p in procs:
            p.start()
        got = dict(out.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(30)
        assert all(isinstance(n, int) for n in got.values()), got
        assert got[0] >= 70 and got[1] >= 90, got
        r = es.open(url, storage_options=so)
        assert r.index.count.tolist() == [got[0], got[1]]
        data.check_lane(r, 0)
        data.check_lane(r, 1)
        data.check_batch(r.sample(64), r.index)
        leases = [r.backend.get(lease_key(lane)) for lane in (0, 1)]
        if self.atomic:
            assert None not in leases  # released records, not deleted
        else:
            assert leases == [None, None]

    def _race_round(self, url: str, so: dict) -> list[str]:
        barrier, out, done = CTX.Barrier(self.racers), CTX.Queue(), CTX.Event()
        procs = [CTX.Process(target=_race, args=(url, so, barrier, out, done))
                 for _ in range(self.racers)]
        for p in procs:
            p.start()
        try:
            return sorted(out.get(timeout=120) for _ in procs)
        finally:
            done.set()
            for p in procs:
                p.join(60)

    def test_racing_writers_exactly_one_wins_every_round(self, remote):
        """N processes open one lane at the same instant: the server's conditional writes
        let exactly one take the lease, in every round (the first creates the lease object,
        later rounds take over a released one with If-Match)."""
        if not self.atomic:
            pytest.skip("the server ignores preconditions: see the refusal test")
        url, so = remote
        es.create(url, SPEC, capacity=64, shard_rows=16, storage_options=so).close()
        for rnd in range(self.race_rounds):
            results = self._race_round(url, so)
            assert results == ["locked"] * (self.racers - 1) + ["won"], (rnd, results)

    def test_racing_writers_are_refused_without_preconditions(self, remote):
        """A server that accepts any conditional write cannot keep writers apart: every
        racer is refused (none pretends to hold the lane), one writer with lease_ttl=None
        works."""
        if self.atomic:
            pytest.skip("the server honours preconditions: see the race test")
        url, so = remote
        es.create(url, SPEC, capacity=64, shard_rows=16, storage_options=so,
                  lease_ttl=None).close()
        assert self._race_round(url, so) == ["unsupported"] * self.racers
        b = backend_for(url, so)
        assert b.get(lease_key(0)) is None  # refused before writing anything
        with pytest.raises(LeaseUnsupportedError, match=r"no atomic conditional writes"):
            es.open(url, mode="r+", lane=0, storage_options=so)
        w = es.open(url, mode="r+", lane=0, storage_options=so, lease_ttl=None)
        nxt = write(w, 0, 0, 40, session=1)
        w.close()
        r = es.open(url, storage_options=so)
        assert int(r.index.count[0]) == nxt
        data.check_lane(r, 0)

    @pytest.mark.parametrize("point", ["commit.shards", "commit.state"])
    def test_a_writer_that_lost_its_lane_commits_nothing(self, remote, point):
        """Fencing: paused between its ownership check and its uploads / state PUT while
        another process takes the lane over, the old owner fails and overwrites nothing."""
        if not self.atomic:
            pytest.skip("the server ignores preconditions: leases are refused there")
        fenced_takeover(*remote, point)

    # -- versions -------------------------------------------------------------------------
    def test_replaced_shard_is_never_read_as_the_old_version(self, remote):
        """A reader whose index predates a wrap-around never returns the new lap's bytes
        for old steps (pinned handles, or header re-checks where the server names no
        version)."""
        url, so = remote
        store = es.create(url, SPEC, capacity=64, shard_rows=16, storage_options=so,
                          **self._lease_ttl())
        nxt = write(store, 0, 0, 40, session=1)
        store.flush()
        r = es.open(url, storage_options=so, cache_bytes=0)  # storage's check, not the cache
        old = np.arange(0, 16)
        rows = r.index.lane_rows(0, old)
        buf = np.empty((16, *SPEC.fields["obs.pixels"].shape), np.uint8)
        assert r.reader.read("obs.pixels", rows, old, buf).all()
        write(store, 0, nxt, 60, session=1)  # the ring wraps: shard 0 holds a new lap
        store.flush()
        assert not r.reader.read("obs.pixels", rows, old, buf).any()
        r.refresh()
        cur = int(r.index.count[0])
        steps = np.arange(cur - cur % 16, cur)
        got = np.empty((len(steps), *buf.shape[1:]), np.uint8)
        assert r.reader.read("obs.pixels", r.index.lane_rows(0, steps), steps, got).all()
        assert np.array_equal(data.frame_header(got)[0], steps)
        store.close()

    # -- faults ---------------------------------------------------------------------------
    def test_writes_ride_through_an_endpoint_restart(self, remote, server):
        url, direct = remote
        with TcpProxy(server.port) as proxy:
            so = self.options_for(proxy.endpoint)
            store = es.create(url, SPEC, capacity=2048, shard_rows=16, storage_options=so,
                              **self._lease_ttl())
            store.backend.retry = RetryPolicy(attempts=60, base=0.05, max_delay=0.3,
                                              deadline=30)
            cut = threading.Timer(0.4, proxy.cut)
            back = threading.Timer(2.4, proxy.restore)
            cut.start()
            back.start()
            nxt, flushes, after = 0, 0, 0
            # writing and flushing through the outage, and 3 flushes after it (at least 4 in
            # all: a flush held up by the whole outage may be the only one during it)
            while after < 3 or flushes < 4:
                nxt = write(store, 0, nxt, 10, session=1, per=10)
                store.flush()
                flushes += 1
                after += proxy._up and not back.is_alive()
            back.join()
            assert store.backend.requests["retried"] > 0, "the outage hit no request"
            store.close()
        r = es.open(url, storage_options=direct)
        assert int(r.index.count[0]) == nxt >= 10 * flushes and flushes >= 4
        data.check_lane(r, 0)

    def test_writer_killed_mid_write_reopens_at_last_commit(self, remote):
        if not self.atomic:
            pytest.skip("a killed writer's lease matters only where leases exist")
        url, so = remote
        store = es.create(url, SPEC, capacity=4096, shard_rows=16, storage_options=so)
        start = write(store, 0, 0, 30, session=1)
        store.close()
        ready = CTX.Event()
        p = CTX.Process(target=_kill_target, args=(url, so, ready), daemon=True)
        p.start()
        assert ready.wait(60)
        time.sleep(1.5)  # several flushes, then die in the middle of whatever it was doing
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        r = es.open(url, storage_options=so)
        committed = read_state(r.backend, 0).count
        assert int(r.index.count[0]) == committed > start
        data.check_lane(r, 0, starts={start})  # every committed row exact, nothing torn
        w = es.open(url, mode="r+", storage_options=so)  # the dead writer's lease: same host
        write(w, 0, int(w.index.count[0]), 10, session=3)
        w.close()
        assert r.backend.get(state_key(0)) is not None
