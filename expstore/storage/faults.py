"""Crash points: named places in the commit path where a test can freeze a writer to kill it.

Unarmed (the default) a crash point costs one global lookup: call sites read
``if faults.ARMED: faults.hit(name)``. A test arms one point with the environment variable
``EXPSTORE_CRASH_POINT=name[:nth]`` (read at import) or :func:`arm` (in a forked child); the
``nth`` time the process reaches it, it reports ``CRASHPOINT name`` (stdout line, or the
``notify`` callback) and sleeps until killed; armed with a ``resume`` event, it waits for
that event instead and goes on (a writer paused at a point while another process acts).

Points: ``flush.drop`` (before committing a state that drops rows a wrap-around will
overwrite), ``flush.shards`` (some fields' shards of a flush written, others not),
``flush.state`` (all shards written, lane state not yet), ``flush.done`` (state committed),
``put.rename`` (a local object's temp file written and synced, not yet renamed),
``put.upload`` (one object of a remote flush's concurrent uploads written, others in
flight or not started), ``commit.shards`` (a leased writer on an object store checked
its lane is its own, shard uploads next), ``commit.state`` (checked, lane state PUT next).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

POINTS = ("flush.drop", "flush.shards", "flush.state", "flush.done", "put.rename",
          "put.upload", "commit.shards", "commit.state")
#: points only local stores reach / only remote (object store) flushes reach
LOCAL_ONLY = ("put.rename",)
REMOTE_ONLY = ("put.upload", "commit.shards", "commit.state")

ARMED: str | None = os.environ.get("EXPSTORE_CRASH_POINT") or None
_nth = 1
_hits = 0
_notify: Callable[[str], None] | None = None
_resume: Any = None  # a threading.Event: pause until set, then go on


def arm(point: str | None, nth: int = 1, notify: Callable[[str], None] | None = None,
        resume: Any = None) -> None:
    """Freeze at the ``nth`` time ``point`` is reached (``None`` disarms); with ``resume``
    (a ``threading.Event``), pause there until it is set and go on (once)."""
    global ARMED, _nth, _hits, _notify, _resume
    if point is not None and point not in POINTS:
        raise ValueError(f"crash point: expected one of {POINTS}, got {point!r}")
    ARMED, _nth, _hits, _notify, _resume = point, int(nth), 0, notify, resume


if ARMED and ":" in ARMED:
    ARMED, _n = ARMED.split(":", 1)
    _nth = int(_n)


def hit(name: str) -> None:
    """Called at crash point ``name`` while armed."""
    global _hits
    if name != ARMED:
        return
    _hits += 1
    if _hits < _nth:
        return
    if _notify is not None:
        _notify(name)
    else:
        sys.stdout.write(f"CRASHPOINT {name}\n")
        sys.stdout.flush()
    if _resume is not None:
        _resume.wait()
        return
    while True:  # the test kills us here
        time.sleep(3600)
