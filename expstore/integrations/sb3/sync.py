"""Writing a buffer's RAM mirror to its store on a background thread, in add order.

Every ``chunk`` adds the buffer copies the new steps out of the ring (a few microseconds
for small fields) and queues the copy; a daemon thread appends queued copies to the store,
lane by lane, through a :class:`StepWriter`. The adding thread waits only when more than
``max_pending`` steps are queued (the store has fallen that far behind).
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from ...errors import ExpstoreError
from ..step_writer import StepWriter


class StoreSync:
    """A daemon thread appending queued windows of steps (leading axes ``(steps,
    n_envs)``) to the store. A failed write stops the writing; :meth:`check` raises it."""

    def __init__(self, writer: StepWriter, n_envs: int, max_pending: int) -> None:
        self.writer, self.n_envs = writer, int(n_envs)
        self.max_pending = max(int(max_pending), 1)
        self.pending = 0  # steps queued or being written
        self.error: BaseException | None = None
        self._queue: deque[dict[str, np.ndarray]] = deque()
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="expstore-sb3-sync", daemon=True)
        self._thread.start()

    def submit(self, window: dict[str, np.ndarray]) -> None:
        """Queue ``window`` (a copy the caller no longer touches)."""
        self.check()
        steps = len(window["reward"])
        with self._cond:
            while self.pending and self.pending + steps > self.max_pending \
                    and self.error is None:
                self._cond.wait()
            self._queue.append(window)
            self.pending += steps
            self._cond.notify_all()
        self.check()

    def wait(self) -> None:
        """Return once every queued step is in the store; raise a write's error."""
        with self._cond:
            while self.pending and self.error is None:
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
                window = self._queue[0]
            try:
                for lane in range(self.n_envs):
                    self.writer.extend(lane, {k: v[:, lane] for k, v in window.items()})
            except BaseException as e:  # noqa: BLE001  (reported by check())
                with cond:
                    self.error = e
                    cond.notify_all()
                return
            with cond:
                self._queue.popleft()
                self.pending -= len(window["reward"])
                cond.notify_all()
