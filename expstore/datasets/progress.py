"""Progress and Ctrl-C for long imports/exports.

* :class:`Progress` — a tqdm bar (rows of a known total, MB/s of decoded bytes where the
  caller counts them, ETA) or a callback, or nothing.
* :func:`interruptible` — while importing, Ctrl-C only sets a flag; the importer stops at
  the next block boundary, flushes the store and raises ``KeyboardInterrupt`` (a second
  Ctrl-C interrupts at once).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: ``True`` (a tqdm bar), a callback ``fn(rows, bytes)``, or ``False``/``None`` (nothing)
ProgressArg = bool | Callable[[int, int], None] | None


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
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="row", unit_scale=True,
                             dynamic_ncols=True, smoothing=0.05)

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
