"""Progress and Ctrl-C for long imports/exports.

* :class:`Progress` — a tqdm bar (rows of a known total, MB/s of decoded bytes where the
  caller counts them, ETA) or a callback, or nothing.
* :func:`progress_bar` — the bar itself: tqdm on a terminal; where stderr is not a
  terminal (a log file, a pipe, a batch job) a :class:`LineProgress` that writes one plain
  line every :data:`LOG_INTERVAL` seconds and one at the end, never ``\\r`` redraws.
* :func:`interruptible` — while importing, Ctrl-C only sets a flag; the importer stops at
  the next block boundary, flushes the store and raises ``KeyboardInterrupt`` (a second
  Ctrl-C interrupts at once).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: ``True`` (a tqdm bar), a callback ``fn(rows, bytes)``, or ``False``/``None`` (nothing)
ProgressArg = bool | Callable[[int, int], None] | None

#: seconds between the lines a progress bar writes where stderr is not a terminal
LOG_INTERVAL = 10.0


class LineProgress:
    """A progress bar for logs: one line ``desc: rows/total rows (pct), elapsed, ETA``
    every ``interval`` seconds and one when closed (the subset of tqdm's interface expstore
    uses: ``update``, ``total``, ``set_postfix_str``, ``refresh``, ``close``)."""

    def __init__(self, desc: str, total: float | None = None, interval: float = LOG_INTERVAL,
                 file: Any = None) -> None:
        self.desc = desc
        self.total = total
        self.n: float = 0
        self.interval = float(interval)
        self.file = file
        self._postfix = ""
        self._t0 = self._last = time.monotonic()
        self._closed = False

    def _line(self, now: float) -> str:
        dt = now - self._t0
        done = f"{self.n:,.0f}"
        if self.total:
            pct = 100.0 * self.n / self.total
            done += f"/{self.total:,.0f} rows ({pct:.0f}%)"
        else:
            done += " rows"
        parts = [f"{dt:.1f} s"]
        if self.total and 0 < self.n < self.total and dt > 0:
            parts.append(f"ETA {dt * (self.total - self.n) / self.n:.0f} s")
        if dt > 0 and self.n:
            parts.append(f"{self.n / dt:,.0f} rows/s")
        if self._postfix:
            parts.append(self._postfix)
        return f"{self.desc}: {done}, {', '.join(parts)}"

    def _write(self, now: float) -> None:
        print(self._line(now), file=self.file or sys.stderr, flush=True)
        self._last = now

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._write(now)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self._postfix = s

    def refresh(self) -> None:
        """(tqdm redraws; a log gets its next line on schedule)"""

    def close(self) -> None:
        """The final line (none when the work never started: no total, no rows)."""
        if not self._closed:
            self._closed = True
            if self.n or self.total is not None:
                self._write(time.monotonic())


def progress_bar(desc: str, total: float | None = None, **tqdm_kwargs: Any) -> Any:
    """A progress bar on stderr: tqdm (with ``tqdm_kwargs``) when stderr is a terminal,
    else a :class:`LineProgress` (plain lines every :data:`LOG_INTERVAL` s, for logs)."""
    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is None or not isatty():
        return LineProgress(desc, total)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="row", unit_scale=True, dynamic_ncols=True,
                **tqdm_kwargs)


class Progress:
    """Progress of ``total`` rows: a tqdm bar (``True``), a callback ``fn(rows, bytes)``
    called with increments, or nothing (``False``/``None``)."""

    def __init__(self, total: int, desc: str, progress: ProgressArg = None) -> None:
        self.rows: float = 0
        self.bytes = 0
        self._fn = progress if callable(progress) else None
        self._bar = None
        self._t0 = time.perf_counter()
        self._last = 0.0
        if progress is True:
            self._bar = progress_bar(desc, total, smoothing=0.05)

    def update(self, rows: float, nbytes: int = 0) -> None:
        self.rows += rows
        self.bytes += nbytes
        if self._fn is not None:
            self._fn(rows, nbytes)
        if self._bar is not None:
            self._bar.update(rows)
            now = time.perf_counter()
            if self.bytes and now - self._last > 0.5:  # no rate for callers without bytes
                self._last = now
                mbs = self.bytes / max(now - self._t0, 1e-9) / 1e6
                self._bar.set_postfix_str(f"{mbs:,.1f} MB/s", refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            if self.bytes and isinstance(self._bar, LineProgress):  # the final line's rate
                mbs = self.bytes / max(time.perf_counter() - self._t0, 1e-9) / 1e6
                self._bar.set_postfix_str(f"{mbs:,.1f} MB/s")
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
