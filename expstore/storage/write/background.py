"""The threads that write a store's full shards, so that an ``add`` only swaps buffers.

A few threads per store (``Background``), each serving the lanes ``lane % threads``: a
lane's shards, and the lane states covering them, are written by one thread, first handed,
first written, so they stay in order (docs/architecture.md §4); several lanes' shards are
written at once (a vector env fills every lane's shard in the same ``add``, and their
fsyncs overlap). What a thread runs is ``LaneWriter._background_write``; results go back to
the caller's thread through the writer (``LaneWriter.poll``). ``FORKS[0]`` counts the forks
of this process as the child sees them: a writer inherited by a forked child (DataLoader
workers fork) knows it is not its own and refuses to write.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import weakref
from typing import Any

import numpy as np

FORKS = [0]  # forks of this process so far, as seen by the child (writers remember theirs)

#: writing threads per store at most (a store with fewer lanes starts fewer)
THREADS = 4


def _forked() -> None:
    FORKS[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class JobRing:
    """A writing thread's jobs, oldest first: job ``k`` (``taken <= k < added``, with
    ``ends = [taken, added]``, int64) is ``(writers[k % size], shards[k % size])``; a
    ``None`` writer stops the thread. Adding a job allocates nothing (the slots are fixed
    lists): the step kernel adds one inside the add that completes a shard (``hand_off``
    in ``step_shards.h``; it leaves a full ring to :meth:`append`, which grows it). One
    thread adds (the store's caller), one takes (the writing thread)."""

    def __init__(self, size: int = 16) -> None:
        self.writers: list = [None] * size
        self.shards: list = [None] * size
        self.ends = np.zeros(2, np.int64)
        self._lock = threading.Lock()  # taking against growing (moves the slots)

    def __len__(self) -> int:
        return int(self.ends[1] - self.ends[0])

    def append(self, job: tuple[Any, Any] | None) -> None:
        writer, shard = job if job is not None else (None, None)
        size = len(self.shards)
        if self.ends[1] - self.ends[0] >= size:
            with self._lock:  # full: the jobs in order, in slots twice as many
                taken, added = (int(e) for e in self.ends)
                old = [(self.writers[k % size], self.shards[k % size])
                       for k in range(taken, added)]
                self.writers[:] = [w for w, _ in old] + [None] * size
                self.shards[:] = [s for _, s in old] + [None] * size
                self.ends[:] = (0, len(old))
                size *= 2
        k = int(self.ends[1]) % size
        self.writers[k], self.shards[k] = writer, shard
        self.ends[1] += 1  # (after the slots: the taker reads them once it sees this)

    def popleft(self) -> tuple[Any, Any] | None:
        """The oldest job (the ring must not be empty)."""
        with self._lock:
            taken = int(self.ends[0])
            k = taken % len(self.shards)
            writer, shard = self.writers[k], self.shards[k]
            self.writers[k] = self.shards[k] = None
            self.ends[0] = taken + 1
        return None if writer is None else (writer, shard)


class Worker:
    """One writing thread: its jobs (:class:`JobRing`), its wake-up event, and
    ``sleeping`` (one byte, 1 while the thread blocks until woken: read by the step
    kernel, which then leaves the hand-off to the Python path)."""

    def __init__(self, news: dict, poll: tuple[float, float], idle: float,
                 ring: int = 16) -> None:
        self.jobs = JobRing(ring)
        self.wake = threading.Event()
        self.sleeping = np.zeros(1, np.uint8)
        # the thread holds no reference to this object: collecting it stops the thread
        self.thread = threading.Thread(target=_run, name="expstore-writer", daemon=True,
                                       args=(self.jobs, self.wake, self.sleeping, news,
                                             poll, idle))
        self.thread.start()
        weakref.finalize(self, _stop, self.jobs, self.wake)


class Background:
    """The threads that write full shards of one store's lanes: lane ``i``'s shards go to
    thread ``i % threads``, first handed, first written (so each lane's shards, and the
    lane states covering them, stay in order). A thread starts when its first lane's
    writer asks for it (:meth:`worker`, when the writer is made).

    Handing a shard over is a job in a ring, with no wake-up: waking a thread from inside
    an ``add`` costs a context switch (~30 µs here). A thread looks for work every
    ``POLL`` seconds after a write, twice as long after each look that finds none (up to
    ``MAX_POLL``: each look takes the GIL from the training loop, and a thread polling
    every 2 ms slowed SB3 DQN on CartPole by ~10%), and after ``IDLE`` seconds without work
    it blocks until the next hand-over wakes it. A caller that needs a buffer or a flush
    wakes the thread at once (:meth:`hurry`).
    """

    POLL = 0.002
    MAX_POLL = 0.064
    IDLE = 5.0
    RING = 16  # job slots per thread to begin with (more when a hand-over finds them full)

    def __init__(self, threads: int = THREADS) -> None:
        self.threads = max(1, int(threads))
        self.workers: list[Worker | None] = [None] * self.threads
        self.state = {"news": False}  # shared with the threads
        self.forks = FORKS[0]

    @property
    def news(self) -> bool:
        """Results wait for a poll on the caller's thread."""
        return self.state["news"]

    def start(self) -> None:
        """Nothing to do: each thread starts when a writer first asks for it."""

    def worker(self, lane: int) -> Worker:
        """The thread writing ``lane``'s shards (started on first use)."""
        k = lane % self.threads
        w = self.workers[k]
        if w is None:
            w = self.workers[k] = Worker(self.state, (self.POLL, self.MAX_POLL),
                                         self.IDLE, self.RING)
        return w

    def submit(self, writer: Any, shard: Any) -> None:
        w = self.worker(writer.lane)
        w.jobs.append((writer, shard))
        if w.sleeping[0]:
            w.wake.set()

    def hurry(self) -> None:
        """The caller waits for a write: do not let a thread sleep out a poll interval."""
        for w in self.workers:
            if w is not None:
                w.wake.set()

    def close(self) -> None:
        """Stop the threads once the shards handed to them are written."""
        for k, w in enumerate(self.workers):
            if w is not None and self.forks == FORKS[0] and w.thread.is_alive():
                _stop(w.jobs, w.wake)
                w.thread.join()
            self.workers[k] = None


def _stop(jobs: JobRing, wake: threading.Event) -> None:
    jobs.append(None)
    wake.set()


def _run(jobs: JobRing, wake: threading.Event, sleeping: np.ndarray, news: dict,
         poll: tuple[float, float], idle: float) -> None:
    last = time.monotonic()
    first, most = poll
    interval = first
    while True:
        if jobs:
            job = jobs.popleft()
            if job is None:
                return
            writer, shard = job
            writer._background_write(shard)
            del writer, shard, job
            news["news"] = True
            last = time.monotonic()
            interval = first  # shards come in runs: look again soon
            continue
        if time.monotonic() - last < idle:
            if wake.wait(interval):
                interval = first  # hurried: a caller waits
            else:
                interval = min(interval * 2, most)
        else:
            sleeping[0] = 1
            if not jobs:  # (a hand-over after this check sees ``sleeping`` and wakes us)
                wake.wait()
            sleeping[0] = 0
            last = time.monotonic()
        wake.clear()


def check_lease(lease: Any, url: str, lane: int) -> None:
    """The background thread's check of a lane lease before it writes: still held, renewed
    recently (else the write waits for the next flush), and, one GET, not taken over by
    another process. It never renews the lease: the caller's thread does."""
    from ...errors import StoreLockedError

    if lease is None:
        return
    if not lease.held:
        raise StoreLockedError(f"{url}: lane {lane}: this writer no longer holds the lane's "
                               f"lease ({lease.lost or 'lost'})")
    if time.monotonic() - lease.renewed_at > lease.ttl * 2 / 3:
        raise OSError(errno.EAGAIN, "lane lease not renewed recently; the write waits for "
                      "the next flush()")
    holder = lease.holder()
    if holder is not None:
        raise StoreLockedError(f"{url}: lane {lane}: the lane's lease is held by "
                               f"{holder[0].describe()}; rows this writer had not flushed "
                               "were not committed")
