"""Writing a buffer's RAM mirror to its store on a background thread, in add order.

The mirror itself is the queue: the thread copies the steps added since its last pass
(``taken .. target``) out of the ring and appends them to the store, lane by lane, through
a :class:`StepWriter`. The adding thread never waits unless it is about to overwrite a
step the store has not taken yet (the store writes more slowly than RAM for a whole
buffer's worth of steps).
"""

from __future__ import annotations

import threading

from ...errors import ExpstoreError
from ..step_writer import StepWriter
from .mirror import RamMirror


class StoreSync:
    """A daemon thread appending ``mirror`` steps ``taken..target`` to the store.
    A failed write stops the writing; :meth:`check` raises it."""

    def __init__(self, writer: StepWriter, mirror: RamMirror, taken: int) -> None:
        self.writer, self.mirror = writer, mirror
        self.taken = self.written = self.target = int(taken)
        self.error: BaseException | None = None
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="expstore-sb3-sync", daemon=True)
        self._thread.start()

    def request(self, target: int, room: int) -> None:
        """Have steps up to add count ``target`` written; block until at most ``room``
        steps wait to be taken (so the next ``room`` adds overwrite none of them)."""
        self.check()
        with self._cond:
            self.target = max(self.target, int(target))
            self._cond.notify_all()
            while self.target - self.taken > room and self.error is None:
                self._cond.wait()
        self.check()

    def wait(self, target: int) -> None:
        """Return once every step up to ``target`` is in the store; raise a write's error."""
        self.check()
        with self._cond:
            self.target = max(self.target, int(target))
            self._cond.notify_all()
            while self.written < target and self.error is None:
                self._cond.wait()
        self.check()

    def check(self) -> None:
        if self.error is not None:
            raise ExpstoreError(f"writing replay steps to {self.writer.store.url} failed "
                                f"(the steps stay sampleable from RAM): {self.error}") \
                from self.error

    def stop(self) -> None:
        """Write every requested step, then end the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while self.target == self.taken and not self._stop:
                    cond.wait()
                if self.target == self.taken:  # stopping, nothing left
                    return
                start, stop = self.taken, self.target
            try:
                window = self.mirror.window(start, stop)  # the ring slots are still intact
                with cond:
                    self.taken = stop
                    cond.notify_all()
                for lane in range(self.mirror.n_envs):
                    self.writer.extend(lane, {k: v[:, lane] for k, v in window.items()})
            except BaseException as e:  # noqa: BLE001  (reported by check())
                with cond:
                    self.error = e
                    cond.notify_all()
                return
            with cond:
                self.written = stop
                cond.notify_all()
