"""Many writers: one process per lane (on S3 and local disk), a sampling reader, leases."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

import expstore as es
from expstore.storage.ownership import lease_key
from expstore.testing import data

SPEC = data.spec()
CTX = mp.get_context("fork")


def write(store, lane: int, start: int, steps: int, session: int, per: int = 10) -> int:
    nxt = start
    while steps > 0:
        batch, nxt = data.make_steps(lane, nxt, min(per, steps), session)
        store.extend(batch, lane=lane)
        store.flush()
        steps -= per
    return nxt


def _lane_writer(url, so, lane, steps, out) -> None:
    store = es.open(url, mode="r+", lane=lane, storage_options=so)
    nxt = write(store, lane, int(store.index.count[lane]), steps, session=1)
    store.close()
    out.put((lane, nxt))


def test_three_writer_processes_and_a_sampling_reader(s3_url):
    url, so = s3_url
    es.create(url, SPEC, capacity=3 * 96, lanes=3, shard_rows=16, storage_options=so).close()
    out = CTX.Queue()
    procs = [CTX.Process(target=_lane_writer, args=(url, so, lane, 110 + 20 * lane, out))
             for lane in range(3)]
    for p in procs:
        p.start()
    reader = es.open(url, storage_options=so)
    sampler = es.PrioritizedSampler(reader, seed=0, refresh_every=0.0, persist=False)
    seen_lanes, checked, batches = set(), 0, 0
    while any(p.is_alive() for p in procs) or batches < 3:
        try:
            batch = sampler.sample(32)  # refreshes lane states first (refresh_every=0)
        except es.NotEnoughData:
            time.sleep(0.05)
            continue
        # every sampled row is what its lane's writer wrote (frames carry lane and step)
        checked += data.check_batch(batch, sampler.index)
        seen_lanes.update((batch["index"] // reader.layout.lane_capacity).tolist())
        sampler.update_priorities(batch["index"], np.abs(batch["reward"]) + 1,
                                  batch["step_id"])
        batches += 1
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    ends = dict(out.get(timeout=5) for _ in procs)
    reader.refresh()
    assert reader.index.count.tolist() == [ends[0], ends[1], ends[2]]
    for lane in range(3):
        data.check_lane(reader, lane)  # every intact row of every lane, byte for byte
    batch = sampler.sample(256)
    data.check_batch(batch, sampler.index)
    seen_lanes.update((batch["index"] // reader.layout.lane_capacity).tolist())
    assert seen_lanes == {0, 1, 2} and checked >= 3 * 32


def _hold_lane(url, so, ready, release, ttl) -> None:
    store = es.open(url, mode="r+", lane=0, storage_options=so, lease_ttl=ttl)
    write(store, 0, 0, 12, session=1)
    ready.set()
    release.wait(60)
    store.close()


@pytest.mark.parametrize("where", ["s3", "local"])
def test_second_writer_of_a_lane_is_refused_until_released(where, s3_url, tmp_path):
    url, so = s3_url if where == "s3" else (str(tmp_path / "s.zarr"), None)
    es.create(url, SPEC, capacity=2 * 64, lanes=2, shard_rows=16, storage_options=so).close()
    ready, release = CTX.Event(), CTX.Event()
    holder = CTX.Process(target=_hold_lane, args=(url, so, ready, release, 60.0))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(es.StoreLockedError,
                           match=rf"lane_0.lease: lane 0 is being written by .* pid "
                                 rf"{holder.pid} .*expires .*UTC \(in \d+ s\)"):
            es.open(url, mode="r+", lane=0, storage_options=so)
        with pytest.raises(es.StoreLockedError, match="lane 0"):
            es.open(url, mode="r+", storage_options=so)  # all lanes: lane 0 is taken
        other = es.open(url, mode="r+", lane=1, storage_options=so)  # lane 1 is free
        write(other, 1, 0, 5, session=1)
        other.close()
        assert int(es.open(url, storage_options=so).index.count[0]) > 0  # readers are free
        with pytest.raises(es.StoreLockedError, match="cannot overwrite: lane 0"):
            es.create(url, SPEC, capacity=128, lanes=2, shard_rows=16, overwrite=True,
                      storage_options=so)
    finally:
        release.set()
        holder.join(30)
    assert holder.exitcode == 0
    w = es.open(url, mode="r+", lane=0, storage_options=so)  # released by close()
    write(w, 0, int(w.index.count[0]), 5, session=2)
    w.close()


def _race(url, so, barrier, out, done) -> None:
    barrier.wait(30)
    try:
        store = es.open(url, mode="r+", lane=0, storage_options=so)
    except es.StoreLockedError:
        out.put("locked")
        return
    out.put("won")
    done.wait(60)
    store.close()


def test_racing_writers_exactly_one_wins(s3_url):
    """Conditional PUTs (If-None-Match / If-Match) let exactly one of N racers take a lane."""
    url, so = s3_url
    es.create(url, SPEC, capacity=64, shard_rows=16, storage_options=so).close()
    n = 4
    barrier, out, done = CTX.Barrier(n), CTX.Queue(), CTX.Event()
    procs = [CTX.Process(target=_race, args=(url, so, barrier, out, done)) for _ in range(n)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=60) for _ in procs)
    done.set()
    for p in procs:
        p.join(30)
    assert results == ["locked"] * (n - 1) + ["won"]


def _stalled_writer(url, so, ready, go, out) -> None:
    store = es.open(url, mode="r+", lane=0, storage_options=so, lease_ttl=3.0)
    nxt = write(store, 0, 0, 20, session=1)
    ready.set()
    go.wait(60)
    try:
        write(store, 0, nxt, 20, session=1)
        out.put("wrote")
    except es.StoreLockedError as e:
        out.put(f"locked: {e}")


def test_expired_lease_is_taken_over_and_the_stalled_writer_stops(s3_url):
    url, so = s3_url
    es.create(url, SPEC, capacity=128, shard_rows=16, storage_options=so).close()
    ready, go, out = CTX.Event(), CTX.Event(), CTX.Queue()
    p = CTX.Process(target=_stalled_writer, args=(url, so, ready, go, out))
    p.start()
    assert ready.wait(60)
    os.kill(p.pid, signal.SIGSTOP)  # alive but not renewing (a GC pause, a frozen VM...)
    try:
        with pytest.raises(es.StoreLockedError, match="lane 0"):
            es.open(url, mode="r+", lane=0, storage_options=so)
        time.sleep(3.3)  # its 3 s lease expires (it had >= 2 s left at its last write)
        w = es.open(url, mode="r+", lane=0, storage_options=so)
        start = int(w.index.count[0])
        end = write(w, 0, start, 15, session=2)
    finally:
        os.kill(p.pid, signal.SIGCONT)
    go.set()
    msg = out.get(timeout=60)
    p.join(30)
    assert msg.startswith("locked") and "lost its lease" in msg, msg
    w.close()
    r = es.open(url, storage_options=so)
    assert int(r.index.count[0]) == end
    data.check_lane(r, 0, starts={start})  # nothing of the stalled writer after takeover


def test_lease_objects_and_release(tmp_path):
    url = tmp_path / "s.zarr"
    store = es.create(url, SPEC, capacity=128, lanes=2, shard_rows=16)
    assert (url / lease_key(0)).exists() and (url / lease_key(1)).exists()
    store.close()
    again = es.open(url, mode="r+", lane=1)  # released: free at once
    again.close()
    with pytest.raises(ValueError, match="the store is closed"):
        write(again, 1, 0, 3, session=1)  # a closed store writes nothing, and says why


def test_sampler_refresh_every_picks_up_rows_of_other_writers(tmp_path):
    url = tmp_path / "s.zarr"
    es.create(url, SPEC, capacity=2 * 128, lanes=2, shard_rows=16).close()
    w0 = es.open(url, mode="r+", lane=0)
    write(w0, 0, 0, 40, session=1)
    reader = es.open(url)
    never = es.UniformSampler(reader, seed=1, refresh_every=None)  # (default: every 1 s)
    often = es.UniformSampler(reader, seed=1, refresh_every=0.0)
    later = es.UniformSampler(reader, seed=1, refresh_every=3600.0)
    w1 = es.open(url, mode="r+", lane=1)  # another writer (a process elsewhere, in effect)
    write(w1, 1, 0, 60, session=1)
    L = reader.layout.lane_capacity
    for s in (never, later):
        assert not (s.sample(128)["index"] >= L).any()  # lane 1's rows not seen yet
    batch = often.sample(128)
    assert (batch["index"] >= L).any() and int(reader.index.count[1]) > 0
    data.check_batch(batch, reader.index)
    w0.close()
    w1.close()
