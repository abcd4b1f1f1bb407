"""Streaming rows in blocks: :func:`blocks` (row ranges) and :class:`Prefetch` (reading
ahead in a background thread)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np


def check_block_rows(block_rows: Any) -> int:
    """``block_rows`` as an int >= 1, or a ``ValueError`` naming it (never a silent empty
    import, nor ``range()``'s own message)."""
    if isinstance(block_rows, bool) or not isinstance(block_rows, (int, np.integer)) \
            or block_rows < 1:
        raise ValueError(f"block_rows: expected an int >= 1 (rows read and written at a "
                         f"time), got {block_rows!r}")
    return int(block_rows)


def blocks(start: int, stop: int, size: int) -> Iterator[tuple[int, int]]:
    """``[a, b)`` pieces of ``[start, stop)`` of at most ``size`` (>= 1)."""
    for a in range(start, stop, check_block_rows(size)):
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
