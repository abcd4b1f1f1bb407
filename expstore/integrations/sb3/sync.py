"""Writing a buffer's RAM mirror to its store on a background thread, in add order.

Every ``chunk`` adds the buffer queues the range of new add counts; a daemon thread reads
those steps straight out of the mirror's ring (views where the range does not wrap, no
copy on the adding thread) and appends them to the store, lane by lane, through a
:class:`StepWriter`. The adding thread waits only before it would overwrite a step the
thread has not written yet (the store has fallen ``size - chunk`` adds behind).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import numpy as np

from ...errors import ExpstoreError
from ..step_writer import StepWriter

#: ``window(start, stop)``: the steps with add counts ``start..stop-1`` (leading axes
#: ``(steps, n_envs)``), valid until the adding thread overwrites them
Window = Callable[[int, int], dict[str, np.ndarray]]


class StoreSync:
    """A daemon thread appending queued ranges of adds to the store. A failed write stops
    the writing; :meth:`check` raises it."""

    def __init__(self, writer: StepWriter, n_envs: int, window: Window, written: int = 0,
                 lock: threading.Lock | None = None) -> None:
        self.writer, self.n_envs, self.window = writer, int(n_envs), window
        #: held while a range is appended (readers of the store take it too)
        self.lock = lock or threading.Lock()
        #: adds ``0..written-1`` are in the store (or were before the buffer opened it)
        self.written = int(written)
        self.error: BaseException | None = None
        self._queue: deque[tuple[int, int]] = deque()
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="expstore-sb3-sync", daemon=True)
        self._thread.start()

    def submit(self, start: int, stop: int) -> None:
        """Queue adds ``start..stop-1`` (``start`` is where the previous range stopped, or
        later if those steps were overwritten unwritten: never, see :meth:`wait_written`)."""
        self.check()
        with self._cond:
            self._queue.append((int(start), int(stop)))
            self._cond.notify_all()

    def wait_written(self, adds: int) -> int:
        """Return (the written count) once adds ``0..adds-1`` are in the store."""
        with self._cond:
            while self.written < adds and self.error is None:
                self._cond.wait()
        self.check()
        return self.written

    def wait(self) -> None:
        """Return once every queued step is in the store; raise a write's error."""
        with self._cond:
            while self._queue and self.error is None:
                self._cond.wait()
        self.check()

    def check(self) -> None:
        if self.error is not None:
            raise ExpstoreError(f"writing replay steps to {self.writer.store.url} failed "
                                f"(the steps stay sampleable from RAM): {self.error}") \
                from self.error

    def stop(self) -> None:
        """Write every queued step, then end the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._queue and not self._stop:
                    cond.wait()
                if not self._queue:  # stopping, nothing left
                    return
                start, stop = self._queue[0]
            try:
                window = self.window(start, stop)
                with self.lock:
                    for lane in range(self.n_envs):
                        self.writer.extend(lane, {k: v[:, lane] for k, v in window.items()})
                    self.written = stop
            except BaseException as e:  # noqa: BLE001  (reported by check())
                with cond:
                    self.error = e
                    cond.notify_all()
                return
            with cond:
                self._queue.popleft()
                cond.notify_all()
