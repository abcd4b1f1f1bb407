"""Readers sampling while a writer wraps the ring: every delivered row must be intact.

:func:`run` starts a writer process (``crash.writer``: random ``add``/``extend``/``flush``
on several lanes of a small ring, so it wraps many times a second), optionally kills and
restarts it every few seconds (each restart is a new session writing different bytes), and
reader processes that open the store read-only and, until a time or sample budget is spent,
``refresh()`` and sample — with ``store.sample`` or through ``make_loader`` with DataLoader
worker processes — checking every sample byte for byte (``data.check_batch``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import api as store_api
from ..sampling import UniformSampler
from . import crash, data


@dataclass
class ReaderResult:
    samples: int = 0  # transitions checked byte for byte
    frames: int = 0  # frames among them (obs + next_obs stacks)
    batches: int = 0
    stale_batches: int = 0  # batches whose every sample was overwritten (StaleBatchError)
    not_enough: int = 0  # sample() calls before enough rows existed
    refreshes: int = 0
    stale_replaced: int = 0  # samples found overwritten and replaced (loader stats)
    unflushed: int = 0  # samples of rows not committed when sampled (read from staging)
    seconds: float = 0.0
    error: str | None = None


def reader(url: str, log_path: str, seconds: float, max_samples: int | None = None,
           batch_size: int = 64, loader_workers: int = 0, seed: int = 0,
           lag: float = 0.05) -> ReaderResult:
    """Sample and check until ``seconds`` pass or ``max_samples`` were checked.

    With probability ``lag`` per batch the reader pauses 0.2-0.6 s first, so it falls
    behind the writer by whole laps of the ring before its next ``refresh()``.
    """
    from ..errors import NotEnoughData, StaleBatchError

    res = ReaderResult()
    store = store_api.open(url, "r")
    lanes = store.lanes
    if loader_workers:  # a loader plans at once: wait for rows (not counted in ``seconds``)
        _wait_for_rows(store, res, rows=64)
    t0 = time.monotonic()

    def done() -> bool:
        return (time.monotonic() - t0 >= seconds
                or (max_samples is not None and res.samples >= max_samples))

    try:
        if loader_workers:
            _loader_reads(store, log_path, res, done, batch_size, loader_workers, seed)
        else:
            rng = np.random.default_rng(seed)
            while not done():
                if rng.random() < lag:
                    time.sleep(rng.uniform(0.2, 0.6))
                store.refresh()
                res.refreshes += 1
                try:
                    batch = store.sample(batch_size, rng=rng)
                except NotEnoughData:
                    res.not_enough += 1
                    time.sleep(0.01)
                    continue
                except StaleBatchError:
                    res.stale_batches += 1
                    continue
                log = crash.Log.read(log_path, lanes)
                res.samples += data.check_batch(batch, store.index, log.session_of)
                res.unflushed += _unflushed(store, batch)
                res.frames += 2 * data.STACK * batch_size
                res.batches += 1
    except Exception:
        res.error = traceback.format_exc()
    finally:
        store.close()
    res.seconds = time.monotonic() - t0
    return res


def _wait_for_rows(store: Any, res: ReaderResult, rows: int, timeout: float = 120.0) -> None:
    """Refresh until the store holds ``rows`` committed rows: the writer process may take
    seconds to start on a loaded machine."""
    deadline = time.monotonic() + timeout
    while int(store.index.present(store.layout.shard_rows).sum()) < rows:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the writer committed fewer than {rows} rows in {timeout:g} s")
        res.not_enough += 1
        time.sleep(0.02)
        store.refresh()


def _loader_reads(store: Any, log_path: str, res: ReaderResult, done: Any, batch_size: int,
                  workers: int, seed: int) -> None:
    from ..loading import make_loader  # imports torch

    sampler = UniformSampler(store, seed=seed, refresh_every=0.02)
    # a guard of half of each lane: this ring is tiny and the writer laps it ~every second
    loader = make_loader(store, sampler, batch_size=batch_size, num_workers=workers,
                            guard=store.layout.lane_capacity // 2)
    it = iter(loader)
    try:
        while not done():
            batch = {k: v.numpy() for k, v in next(it).items()}
            log = crash.Log.read(log_path, store.lanes)
            res.samples += data.check_batch(batch, None, log.session_of,
                                            store.layout.lane_capacity)
            res.unflushed += _unflushed(store, batch)
            res.frames += 2 * data.STACK * batch_size
            res.batches += 1
        res.refreshes = -1  # refreshed by the sampler every 20 ms
        res.stale_replaced = int(loader.stats.stale_replaced)
    finally:
        del it


def _unflushed(store: Any, batch: dict) -> int:
    """Samples whose next row (or the row itself) was not committed: rows another
    process staged, read from shared memory."""
    lane = np.asarray(batch["index"]) // store.layout.lane_capacity
    return int((np.asarray(batch["step_id"]) + 1 >= store.index.committed[lane]).sum())


@dataclass
class RunResult:
    readers: list[ReaderResult]
    writer_sessions: int
    rows_written: list[int]  # committed rows per lane at the end
    laps: float  # times the writer went around each lane's ring (mean over lanes)

    @property
    def samples(self) -> int:
        return sum(r.samples for r in self.readers)

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self.readers if r.error]


def run(workdir: str, seconds: float, readers: int = 1, loader_workers: int = 0,
        restart_every: float | None = None, max_samples: int | None = None,
        batch_size: int = 64, seed: int = 0, lanes: int = 3, shard_rows: int = 32,
        shards_per_lane: int = 4, lag: float = 0.05, adds_only: bool = False) -> RunResult:
    """Writer + ``readers`` reader processes (the last one uses ``loader_workers`` DataLoader
    workers when > 0) for ``seconds``; the writer is SIGKILLed and restarted every
    ``restart_every`` seconds. ``adds_only``: the writer never flushes (``crash.writer``):
    readers see its open shards' rows only through its shared-memory staging."""
    url, log_path = os.path.join(workdir, "store.zarr"), os.path.join(workdir, "writer.log")
    crash.create_store(url, lanes=lanes, shard_rows=shard_rows, shards_per_lane=shards_per_lane)
    if os.path.exists(log_path):
        os.remove(log_path)
    ctx = mp.get_context("fork")
    rng = np.random.default_rng(seed)
    session = 0
    w = ctx.Process(target=crash.writer, args=(url, log_path, session, int(rng.integers(2**31))),
                    kwargs={"adds_only": adds_only}, daemon=True)
    w.start()
    queue = ctx.Queue()
    procs = []
    for i in range(readers):
        lw = loader_workers if i == readers - 1 else 0
        p = ctx.Process(target=_reader_child, args=(queue, i, url, log_path, seconds,
                                                    max_samples, batch_size, lw, seed + i, lag))
        p.start()
        procs.append(p)
    results: dict[int, ReaderResult] = {}
    last = time.monotonic()
    try:
        while len(results) < readers:
            try:
                i, d = queue.get(timeout=0.05)
                results[i] = ReaderResult(**d)
            except Exception:  # queue.Empty
                pass
            if restart_every and time.monotonic() - last >= restart_every:
                os.kill(w.pid, signal.SIGKILL)
                w.join()
                session += 1
                w = ctx.Process(target=crash.writer,
                                args=(url, log_path, session, int(rng.integers(2**31))),
                                kwargs={"adds_only": adds_only}, daemon=True)
                w.start()
                last = time.monotonic()
            if all(not p.is_alive() for p in procs) and queue.empty() and len(results) < readers:
                time.sleep(0.2)
                if queue.empty():
                    raise RuntimeError("a reader process died without a result")
    finally:
        if w.is_alive():
            os.kill(w.pid, signal.SIGKILL)
        w.join()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    store = store_api.open(url, "r")
    counts = [int(c) for c in store.index.count]
    store.close()
    laps = float(np.mean(counts)) / (shard_rows * shards_per_lane)
    return RunResult([results[i] for i in range(readers)], session + 1, counts, laps)


def _reader_child(queue: Any, i: int, *args: Any) -> None:
    res = reader(*args)
    queue.put((i, asdict(res)))
