"""The thread that writes a store's full shards, so that an ``add`` only swaps buffers.

One thread per store (``Background``), first handed, first written: each lane's shards,
and the lane states covering them, stay in order (docs/architecture.md §4). What it runs
is ``LaneWriter._background_write``; results go back to the caller's thread through the
writer (``LaneWriter.poll``). ``FORKS[0]`` counts the forks of this process as the child
sees them: a writer inherited by a forked child (DataLoader workers fork) knows it is not
its own and refuses to write.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import weakref
from collections import deque
from typing import Any

FORKS = [0]  # forks of this process so far, as seen by the child (writers remember theirs)


def _forked() -> None:
    FORKS[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class Background:
    """The thread that writes full shards of one store's lanes, first handed, first written
    (so each lane's shards, and the lane states covering them, stay in order).

    Handing a shard over is a deque append, with no wake-up: waking a thread from inside
    an ``add`` costs a context switch (~30 µs here). The thread looks for work every
    ``POLL`` seconds instead, and after ``IDLE`` seconds without any it blocks until the
    next hand-over wakes it.
    """

    POLL = 0.002
    IDLE = 5.0

    def __init__(self) -> None:
        self.jobs: deque = deque()
        self.wake = threading.Event()
        self.state = {"news": False, "sleeping": False}  # shared with the thread
        self.forks = FORKS[0]
        self.thread: threading.Thread | None = None

    @property
    def news(self) -> bool:
        """Results wait for a poll on the caller's thread."""
        return self.state["news"]

    def start(self) -> None:
        if self.thread is None:
            # the thread holds no reference to this object: collecting it stops the thread
            self.thread = threading.Thread(target=_run, name="expstore-writer", daemon=True,
                                           args=(self.jobs, self.wake, self.state,
                                                 self.POLL, self.IDLE))
            self.thread.start()
            weakref.finalize(self, _stop, self.jobs, self.wake)

    def submit(self, writer: Any, shard: Any) -> None:
        if self.thread is None:
            self.start()
        self.jobs.append((writer, shard))
        if self.state["sleeping"]:
            self.wake.set()

    def hurry(self) -> None:
        """The caller waits for a write: do not let it sleep out a poll interval."""
        self.wake.set()

    def close(self) -> None:
        """Stop the thread once the shards handed to it are written."""
        if self.thread is not None and self.forks == FORKS[0] and self.thread.is_alive():
            _stop(self.jobs, self.wake)
            self.thread.join()
        self.thread = None


def _stop(jobs: deque, wake: threading.Event) -> None:
    jobs.append(None)
    wake.set()


def _run(jobs: deque, wake: threading.Event, state: dict, poll: float, idle: float) -> None:
    last = time.monotonic()
    while True:
        if jobs:
            job = jobs.popleft()
            if job is None:
                return
            writer, shard = job
            writer._background_write(shard)
            del writer, shard, job
            state["news"] = True
            last = time.monotonic()
            continue
        if time.monotonic() - last < idle:
            wake.wait(poll)
        else:
            state["sleeping"] = True
            if not jobs:  # (a hand-over after this check sees ``sleeping`` and wakes us)
                wake.wait()
            state["sleeping"] = False
            last = time.monotonic()
        wake.clear()


def check_lease(lease: Any, url: str, lane: int) -> None:
    """The background thread's check of a lane lease before it writes: still held, renewed
    recently (else the write waits for the next flush), and, one GET, not taken over by
    another process. It never renews the lease: the caller's thread does."""
    from ..errors import StoreLockedError

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
