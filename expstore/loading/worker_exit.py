"""A DataLoader worker that died: the error the loop ends with, and no worker left behind.

torch learns of a worker's death two ways. Its SIGCHLD handler raises "DataLoader worker
(pid N) is killed by signal" in the main thread (and stops watching those workers); where
that handler has not run yet, torch's read of the worker's next batch fails instead: with
"DataLoader worker (pid(s) N) exited unexpectedly" where the worker can already be waited
for, else with the queue's own ``EOFError`` / ``ConnectionResetError`` (the worker died
holding a batch's shared memory). Those last two leave the workers on the handler's watch
list, and it raises the death again at the next child exit, wherever the process is.
"""

from __future__ import annotations

import time
from typing import Any

#: what a worker's death reaches the loop as (see the module's notes)
WORKER_ERRORS = (RuntimeError, EOFError, ConnectionError)


def worker_death(it: Any, error: BaseException) -> BaseException | None:
    """The error a loop over torch iterator ``it`` should end with, after ``error`` came
    out of it: ``None`` where no worker died (``error`` is the caller's to raise as it
    is); else ``it``'s workers are taken off torch's watch list and shut down, and the
    error names the dead ones (``error`` itself where torch's did)."""
    dead = dead_workers(it, wait=not isinstance(error, RuntimeError))
    if not dead and "DataLoader worker" not in str(error):
        return None
    forget_worker_pids(it)
    if hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    if dead and not isinstance(error, RuntimeError):
        return RuntimeError(f"DataLoader worker (pid(s) {', '.join(dead)}) exited "
                            "unexpectedly")
    return error


def dead_workers(it: Any, wait: bool) -> list[str]:
    """Pids of ``it``'s workers that have exited. ``wait``: give them up to 1 s (a worker
    that broke its queue as it died may not be waitable yet)."""
    workers = list(getattr(it, "_workers", ()))
    deadline = time.monotonic() + (1.0 if wait else 0.0)
    while True:
        dead = [str(w.pid) for w in workers if not w.is_alive()]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.01)


def forget_worker_pids(it: Any) -> None:
    """Take ``it``'s workers off torch's SIGCHLD watch list (where they are on it), so
    that no later child exit raises a death again: in ``close``, in the caller's error
    handling, in a test runner's report."""
    if not getattr(it, "_worker_pids_set", False):
        return
    try:
        from torch.utils.data._utils import signal_handling

        signal_handling._remove_worker_pids(id(it))
    except (ImportError, AttributeError, RuntimeError, ValueError):
        return
    it._worker_pids_set = False
