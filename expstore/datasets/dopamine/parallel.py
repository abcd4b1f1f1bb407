"""Checkpoints imported in parallel: :func:`run_lanes`, one worker process per CPU core.

Each worker takes the next checkpoint from a shared queue and streams it into its own lane
(lanes have separate writers and leases, so workers never touch the same object). Workers
send progress and results to the parent, which draws the bar and records finished lanes.
They ignore SIGINT (the parent asks them to stop at a block boundary) and die with the
parent (Linux ``PR_SET_PDEATHSIG``, else a parent check per block), so a killed import
leaves only committed rows behind, never a writer running on its own.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import sys
from collections.abc import Callable
from typing import Any

from .checkpoint import Checkpoint
from .lane import LaneResult, import_lane

_POLL = 0.2  # seconds between checks of the parent's interrupt flag


def default_workers(tasks: int) -> int:
    """One worker per CPU core this process may use, at most one per checkpoint."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, tasks))


def run_lanes(tasks: list[tuple[int, Checkpoint]], url: str, stack: int, block_rows: int, *,
              storage_options: Any, fsync: bool, workers: int | None,
              progress: Callable[[int, int], None], interrupted: Callable[[], bool],
              lane_done: Callable[[LaneResult], None]) -> None:
    """Import each ``(lane, checkpoint)``; ``lane_done(result)`` as each one ends."""
    if not tasks:
        return
    n = default_workers(len(tasks)) if workers is None else max(1, min(int(workers),
                                                                     len(tasks)))
    if n == 1:
        stop = _Flag(interrupted)
        for lane, ck in tasks:
            res = import_lane(ck, url, lane, stack, block_rows, storage_options=storage_options,
                              fsync=fsync, report=progress, stop=stop)
            release_memory()
            lane_done(res)
            if res.stopped:
                return
        return
    _run_processes(tasks, n, (url, stack, block_rows, storage_options, fsync), progress,
                   interrupted, lane_done)


class _Flag:
    """``is_set()`` backed by a callable (the parent's Ctrl-C flag)."""

    def __init__(self, fn: Callable[[], bool]) -> None:
        self._fn = fn

    def is_set(self) -> bool:
        return bool(self._fn())


def _run_processes(tasks: list[tuple[int, Checkpoint]], n: int, args: tuple, progress: Any,
                   interrupted: Callable[[], bool], lane_done: Any) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # no fork of a process holding threads and leases
    todo: Any = ctx.Queue()
    for lane, ck in tasks:
        todo.put((lane, ck))
    for _ in range(n):
        todo.put(None)
    msgs: Any = ctx.Queue()
    stop = ctx.Event()
    procs = [ctx.Process(target=_worker, args=(todo, msgs, stop, os.getpid(), args),
                         name=f"expstore-dopamine-{i}", daemon=True) for i in range(n)]
    for p in procs:
        p.start()
    error: BaseException | None = None
    running = n
    try:
        while running:
            if interrupted() and not stop.is_set():
                stop.set()
            try:
                kind, body = msgs.get(timeout=_POLL)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    dead = [p.exitcode for p in procs]
                    error = error or RuntimeError(f"import worker processes ended without "
                                                  f"reporting (exit codes {dead})")
                    break
                continue
            if kind == "progress":
                progress(*body)
            elif kind == "lane":
                lane_done(body)
            elif kind == "error":
                stop.set()
                error = error or _unpickle(body)
            elif kind == "exit":
                running -= 1
    except BaseException:
        stop.set()
        raise
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
    if error is not None:
        raise error


def _unpickle(body: tuple[bytes | None, str]) -> BaseException:
    blob, text = body
    if blob is not None:
        try:
            return pickle.loads(blob)
        except Exception:  # noqa: BLE001 - fall back to the text below
            pass
    return RuntimeError(text)


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


def release_memory() -> None:
    """Hand freed memory back to the OS after a lane (cyclic garbage, then glibc's free
    lists), so successive checkpoints in one process do not ratchet its RSS up."""
    import gc

    gc.collect()
    libc = _libc()
    if libc is not None:
        try:
            libc.malloc_trim(0)
        except AttributeError:  # not glibc
            pass


def _fixed_mmap_threshold() -> None:
    """Worker processes only: buffers of 1 MiB and more always get their own mapping,
    returned to the OS when freed (glibc's default threshold grows with the blocks freed,
    after which they stay in the heap and the RSS of a long import creeps up)."""
    libc = _libc()
    if libc is not None:
        try:
            libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
        except AttributeError:
            pass


def _die_with_parent() -> None:
    libc = _libc()
    if libc is not None:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _WorkerStop:
    """Stop when the parent asks, or when it is gone."""

    def __init__(self, event: Any, parent: int) -> None:
        self._event = event
        self._parent = parent

    def is_set(self) -> bool:
        if os.getppid() != self._parent:
            os._exit(1)  # parent killed: leave committed rows, nothing else
        return self._event.is_set()


def _worker(todo: Any, msgs: Any, stop: Any, parent: int, args: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    _fixed_mmap_threshold()
    if os.getppid() != parent:
        os._exit(1)
    url, stack, block_rows, storage_options, fsync = args
    flag = _WorkerStop(stop, parent)
    pending = [0, 0]

    def report(rows: int, nbytes: int) -> None:
        pending[0] += rows
        pending[1] += nbytes
        if pending[0] >= 8 * block_rows:
            msgs.put(("progress", tuple(pending)))
            pending[:] = [0, 0]

    try:
        while not flag.is_set():
            task = todo.get()
            if task is None:
                break
            lane, ck = task
            try:
                res = import_lane(ck, url, lane, stack, block_rows,
                                  storage_options=storage_options, fsync=fsync,
                                  report=report, stop=flag)
            except BaseException as e:  # handed to the parent
                try:
                    blob = pickle.dumps(e)
                except Exception:  # noqa: BLE001 - unpicklable: send the text
                    blob = None
                msgs.put(("error", (blob, f"{type(e).__name__}: {e}")))
                break
            release_memory()
            if any(pending):
                msgs.put(("progress", tuple(pending)))
                pending[:] = [0, 0]
            msgs.put(("lane", res))
            if res.stopped:
                break
    finally:
        if any(pending):
            msgs.put(("progress", tuple(pending)))
        msgs.put(("exit", None))
