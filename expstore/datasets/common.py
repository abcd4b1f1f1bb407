"""What the dataset importers/exporters share: errors, progress, Ctrl-C, episode bookkeeping.

* :class:`DatasetFormatError` — a dataset file is not what its format promises (names it).
* :class:`Progress` — a tqdm bar (rows, MB/s, ETA) or a callback, or nothing.
* :func:`interruptible` — while importing, Ctrl-C only sets a flag; the importer stops at
  the next block boundary, flushes the store and raises ``KeyboardInterrupt`` (a second
  Ctrl-C interrupts at once).
* :func:`set_episode_position` — start the next row of a lane at a given position of its
  episode (0: a new episode even after an episode left without final row; ``>0``: a
  continued episode whose first rows are not in the store).
* :func:`lane_rows` — the intact rows of a lane in write order, with their metadata.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ExpstoreError


class DatasetFormatError(ExpstoreError, ValueError):
    """A dataset file is malformed or does not hold what its format requires."""


@dataclass
class ImportSummary:
    """What an import or export did (counts in rows / steps / episodes, time in s)."""

    source: str
    target: str
    rows: int = 0  # store rows written (steps + final rows) or file rows written
    steps: int = 0  # env steps (transitions incl. the open ones)
    episodes: int = 0  # finished episodes
    lanes: int = 0
    seconds: float = 0.0
    bytes_in: int = 0  # raw (decompressed) bytes read from the source
    notes: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        rate = self.steps / self.seconds if self.seconds else float("nan")
        lines = [f"{self.source} -> {self.target}: {self.steps:,} steps, {self.rows:,} rows, "
                 f"{self.episodes:,} episodes, {self.lanes} lane(s) in {self.seconds:.1f} s "
                 f"({rate:,.0f} steps/s)"]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


ProgressArg = bool | Callable[[int, int], None] | None


class Progress:
    """Progress of ``total`` rows: a tqdm bar (``True``), a callback ``fn(rows, bytes)``
    called with increments, or nothing (``False``/``None``)."""

    def __init__(self, total: int, desc: str, progress: ProgressArg = None) -> None:
        self.rows = 0
        self.bytes = 0
        self._fn = progress if callable(progress) else None
        self._bar = None
        self._t0 = time.perf_counter()
        self._last = 0.0
        if progress is True:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="row", unit_scale=True,
                             dynamic_ncols=True, smoothing=0.05)

    def update(self, rows: int, nbytes: int = 0) -> None:
        self.rows += rows
        self.bytes += nbytes
        if self._fn is not None:
            self._fn(rows, nbytes)
        if self._bar is not None:
            self._bar.update(rows)
            now = time.perf_counter()
            if now - self._last > 0.5:
                self._last = now
                mbs = self.bytes / max(now - self._t0, 1e-9) / 1e6
                self._bar.set_postfix_str(f"{mbs:,.0f} MB/s", refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class InterruptFlag:
    """Set by the first Ctrl-C inside :func:`interruptible`."""

    requested: bool = False

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if Ctrl-C was pressed (call between blocks)."""
        if self.requested:
            raise KeyboardInterrupt


@contextmanager
def interruptible() -> Iterator[InterruptFlag]:
    """Defer Ctrl-C to block boundaries (main thread only; elsewhere a plain flag)."""
    flag = InterruptFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    prev = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: Any) -> None:
        flag.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a 2nd Ctrl-C raises now

    signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, prev if prev is not None else signal.default_int_handler)


def set_episode_position(store: Any, lane: int, position: int) -> None:
    """Make the next row written to ``lane`` sit at ``position`` of its episode.

    ``0`` starts a new episode (flag FIRST) even when the lane's last episode has no final
    row (it stays interrupted: its last row cannot start a transition). ``k > 0`` marks
    rows whose first ``k`` predecessors are not stored (a ring buffer's oldest, partly
    overwritten episode): with ``k >= history`` their frame stacks are never padded, so the
    first ``k`` rows of such a lane cannot be sampled (their history is missing).

    Uses the store's per-lane episode counter (no public API sets it yet).
    """
    store._episode_step[lane] = int(position)


@dataclass
class LaneRows:
    """Intact rows of one lane in write order (all arrays have one entry per row)."""

    lane: int
    steps: np.ndarray  # lane steps (int64)
    rows: np.ndarray  # global rows (int64)
    flags: np.ndarray  # uint8 FLAG_*
    episode_step: np.ndarray  # int32


def lane_rows(store: Any, lane: int) -> LaneRows:
    """The intact rows of ``lane`` (from the in-RAM index; oldest first)."""
    idx = store.index
    lo = int(idx.lower_bound()[lane])
    steps = np.arange(lo, int(idx.count[lane]), dtype=np.int64)
    rows = idx.lane_rows(lane, steps)
    return LaneRows(lane, steps, rows, idx.flags[rows].copy(), idx.episode_step[rows].copy())


def read_field(store: Any, name: str, lanes: LaneRows, sel: slice | np.ndarray) -> np.ndarray:
    """Values of field ``name`` at ``lanes.rows[sel]`` (checked against their steps)."""
    return store.read(name, lanes.rows[sel], lanes.steps[sel])


def capacity_for(rows_per_lane: int, lanes: int = 1, capacity: int | None = None) -> int:
    """Store capacity whose lanes each hold ``rows_per_lane`` rows (``create`` rounds it up
    to whole shards); a given ``capacity`` is checked to be large enough."""
    need = max(int(rows_per_lane), 1) * lanes
    if capacity is None:
        return need
    if capacity < need:
        raise ValueError(f"capacity: {capacity} rows cannot hold {lanes} lane(s) of "
                         f"{rows_per_lane} rows (need >= {need})")
    return int(capacity)


def blocks(start: int, stop: int, size: int) -> Iterator[tuple[int, int]]:
    """``[a, b)`` pieces of ``[start, stop)`` of at most ``size``."""
    for a in range(start, stop, size):
        yield a, min(a + size, stop)


class Prefetch:
    """Run an iterator in a background thread, ``depth`` items ahead (I/O and inflate
    release the GIL, so reading overlaps the store's encoding). Exceptions re-raise in
    the consumer; :meth:`close` stops the thread."""

    _END = object()

    def __init__(self, it: Iterator[Any], depth: int = 2) -> None:
        import queue

        self._q: Any = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._it = it
        self._thread = threading.Thread(target=self._run, name="expstore-prefetch",
                                        daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        import queue

        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._it:
                if not self._put((True, item)):
                    return
            self._put((True, self._END))
        except BaseException as e:  # handed to the consumer
            self._put((False, e))
        finally:
            close = getattr(self._it, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Iterator[Any]:
        while True:
            ok, item = self._q.get()
            if not ok:
                raise item
            if item is self._END:
                return
            yield item

    def close(self) -> None:
        import queue

        self._stop.set()
        try:
            while True:
                self._q.get_nowait()
        except queue.Empty:
            pass
        self._thread.join()

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
