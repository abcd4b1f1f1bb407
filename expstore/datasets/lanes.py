"""Source pieces imported in parallel, one lane each, resumably: :func:`run_lanes` (one
worker process per CPU core) and :func:`import_lanes` (the partial-import marker around it;
``datasets/resume.py`` says where a lane goes on). Dopamine checkpoints and RLDS TFRecord
shards are imported through these.

Workers are plain ``python -c`` processes (the caller's ``__main__`` is never re-imported,
so scripts need no ``if __name__ == "__main__"`` guard) connected to the parent by a Unix
socket. Each asks the parent for the next piece (a checkpoint, a shard) and streams it into
its own lane
(lanes have separate writers and leases, so workers never touch the same object), sending
progress and results back; the parent draws the bar and records finished lanes. Workers
run in their own session (a terminal's Ctrl-C reaches only the parent, which asks them to
stop at a block boundary) and die with the parent (Linux ``PR_SET_PDEATHSIG``, else a
parent check per block), so a killed import leaves only committed rows behind, never a
writer running on its own.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_POLL = 0.2  # seconds between checks of the parent's interrupt flag

#: ``lane_fn(lane, piece, *args, report=fn(rows, bytes), stop=flag) -> LaneResult``: imports
#: one piece into one lane; a module-level function (workers receive it pickled by name)
LaneFn = Callable[..., "LaneResult"]


@dataclass
class LaneResult:
    """What one lane's import wrote in this run (rows / steps / episodes; bytes decoded)."""

    lane: int
    rows: int = 0
    steps: int = 0
    episodes: int = 0
    bytes_in: int = 0
    resumed_rows: int = 0  # rows the lane held already (an interrupted import)
    stopped: bool = False  # stopped early on request (Ctrl-C): the lane is not done
    counts: dict[str, int] | None = None  # events a format counts (summed over lanes)


def default_workers(tasks: int) -> int:
    """One worker per CPU core this process may use, at most one per piece."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, tasks))


def run_lanes(tasks: list[tuple[int, Any]], lane_fn: LaneFn, args: tuple, *,
              workers: int | None, progress: Callable[[int, int], None],
              interrupted: Callable[[], bool], lane_done: Callable[[LaneResult], None],
              report_rows: int = 4096) -> None:
    """``lane_fn(lane, piece, *args, ...)`` for each ``(lane, piece)``; ``lane_done(result)``
    as each one ends. Workers send progress every ``report_rows`` source rows."""
    if not tasks:
        return
    n = default_workers(len(tasks)) if workers is None else max(1, min(int(workers),
                                                                     len(tasks)))
    if n == 1:
        stop = _Flag(interrupted)
        for lane, piece in tasks:
            res = lane_fn(lane, piece, *args, report=progress, stop=stop)
            release_memory()
            lane_done(res)
            if res.stopped:
                return
        return
    _run_processes(tasks, n, (lane_fn, args, report_rows), progress, interrupted, lane_done)


class _Flag:
    """``is_set()`` backed by a callable (the parent's Ctrl-C flag)."""

    def __init__(self, fn: Callable[[], bool]) -> None:
        self._fn = fn

    def is_set(self) -> bool:
        return bool(self._fn())


def _run_processes(tasks: list[tuple[int, Any]], n: int, args: tuple, progress: Any,
                   interrupted: Callable[[], bool], lane_done: Any) -> None:
    """Start ``n`` workers (``python -c``, so the caller's ``__main__`` is never
    re-imported), hand out ``tasks`` as workers ask, relay their messages."""
    from multiprocessing.connection import Listener, wait

    authkey = os.urandom(32)
    todo = list(tasks)
    procs: list[subprocess.Popen] = []
    conns: list[Any] = []
    error: BaseException | None = None
    stopping = False
    with Listener(family="AF_UNIX", authkey=authkey) as listener:
        init = pickle.dumps({"address": listener.address, "authkey": authkey,
                             "sys_path": sys.path, "parent": os.getpid(), "args": args})
        try:
            for _ in range(n):
                p = subprocess.Popen([sys.executable, "-c", _BOOT], stdin=subprocess.PIPE,
                                     start_new_session=True, env=worker_env())
                procs.append(p)
                p.stdin.write(init)
                p.stdin.close()
            conns = _accept(listener, procs)
            live = list(conns)
            while live:
                if interrupted() and not stopping:
                    stopping = True
                    _send_all(live, ("stop", None))
                ready = wait(live, timeout=_POLL)
                for c in ready:
                    try:
                        kind, body = c.recv()
                    except (EOFError, OSError):
                        live.remove(c)
                        error = error or RuntimeError("an import worker process ended "
                                                      "without reporting (killed?)")
                        stopping = True
                        _send_all(live, ("stop", None))
                        continue
                    if kind == "next":
                        c.send(("task", None if stopping or not todo else todo.pop(0)))
                    elif kind == "progress":
                        progress(*body)
                    elif kind == "lane":
                        lane_done(body)
                    elif kind == "error":
                        error = error or _unpickle(body)
                        stopping = True
                        _send_all(live, ("stop", None))
                    elif kind == "exit":
                        live.remove(c)
        except BaseException:
            _send_all(conns, ("stop", None))
            raise
        finally:
            for p in procs:
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            for c in conns:
                c.close()
    if error is not None and not interrupted():  # Ctrl-C: the caller raises it
        raise error


def worker_env() -> dict[str, str]:
    """The environment of a worker process: this one's, with the lane writer staging in
    private memory (no reader follows an import's unflushed rows, so the shared staging
    file of ``storage/write/staging.py``, whose pages are all mapped in at open, is not needed;
    private pages are taken only as rows fill them)."""
    env = dict(os.environ)
    env["EXPSTORE_SHARED_STAGING"] = "0"
    return env


_BOOT = ("import pickle, sys; init = pickle.load(sys.stdin.buffer); sys.path[:] = "
         "init['sys_path']; from expstore.datasets.lanes import worker_main; "
         "worker_main(init)")


def _accept(listener: Any, procs: list[subprocess.Popen]) -> list[Any]:
    """One connection per started worker (fails if one dies before connecting)."""
    import threading

    conns: list[Any] = []
    failed: list[BaseException] = []

    def accept() -> None:
        try:
            for _ in procs:
                conns.append(listener.accept())
        except BaseException as e:  # noqa: BLE001 - reported below
            failed.append(e)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    while t.is_alive():
        t.join(_POLL)
        dead = [p.returncode for p in procs if p.poll() is not None]
        if dead and t.is_alive():
            for p in procs:
                if p.poll() is None:
                    p.kill()
            raise RuntimeError(f"an import worker process exited at start (exit code "
                               f"{dead[0]})")
    if failed:
        raise failed[0]
    return conns


def _send_all(conns: list[Any], msg: tuple) -> None:
    for c in conns:
        try:
            c.send(msg)
        except (OSError, EOFError, ValueError):
            pass


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


def _die_with_parent() -> None:
    libc = _libc()
    if libc is not None:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _WorkerStop:
    """Stop when the parent says so, or when it is gone (checked per block)."""

    def __init__(self, conn: Any, parent: int) -> None:
        self._conn = conn
        self._parent = parent
        self.stopped = False

    def is_set(self) -> bool:
        if os.getppid() != self._parent:
            os._exit(1)  # parent killed: leave committed rows, nothing else
        while not self.stopped and self._conn.poll():
            kind, _ = self._conn.recv()
            self.stopped = kind == "stop"
        return self.stopped

    def next_task(self) -> Any:
        """The next ``(lane, piece)`` from the parent, or ``None``."""
        if self.is_set():
            return None
        self._conn.send(("next", None))
        while True:
            kind, body = self._conn.recv()
            if kind == "stop":
                self.stopped = True
            elif kind == "task":
                return None if self.stopped else body


def worker_main(init: dict[str, Any]) -> None:
    """A worker process: import the pieces the parent hands out, one lane each."""
    from multiprocessing.connection import Client

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    parent = init["parent"]
    if os.getppid() != parent:
        os._exit(1)
    lane_fn, args, report_rows = init["args"]
    conn = Client(init["address"], authkey=init["authkey"])
    flag = _WorkerStop(conn, parent)
    pending = [0, 0]

    def report(rows: int, nbytes: int) -> None:
        pending[0] += rows
        pending[1] += nbytes
        if pending[0] >= report_rows:
            conn.send(("progress", tuple(pending)))
            pending[:] = [0, 0]

    try:
        while (task := flag.next_task()) is not None:
            lane, piece = task
            try:
                res = lane_fn(lane, piece, *args, report=report, stop=flag)
            except BaseException as e:  # handed to the parent
                try:
                    blob = pickle.dumps(e)
                except Exception:  # noqa: BLE001 - unpicklable: send the text
                    blob = None
                conn.send(("error", (blob, f"{type(e).__name__}: {e}")))
                break
            release_memory()
            if any(pending):
                conn.send(("progress", tuple(pending)))
                pending[:] = [0, 0]
            conn.send(("lane", res))
            if res.stopped:
                break
    finally:
        if any(pending):
            conn.send(("progress", tuple(pending)))
        conn.send(("exit", None))
        conn.close()


# -- the partial-import marker: which lanes are done, so the same import resumes ----------
def new_marker(fmt: str, source: str, options: dict[str, Any],
               pieces: list[dict[str, Any]]) -> dict[str, Any]:
    """A partial-import marker: one entry per lane (``pieces[i]`` says what lane ``i``
    holds, e.g. ``{"checkpoint": 3}``), none done yet."""
    return {"format": fmt, "source": source, "status": "partial", "options": options,
            "lanes": {str(i): {**p, "done": False} for i, p in enumerate(pieces)}}


def import_lanes(url: str, marker: dict[str, Any], pieces: list[Any], lane_fn: LaneFn,
                 args: tuple, summary: Any, *, total: Callable[[list[int]], int], desc: str,
                 workers: int | None, progress: Any, storage_options: Any,
                 report_rows: int = 4096, name: Callable[[int], str] = str,
                 unit: str = "lane(s)", counts: dict[str, int] | None = None) -> None:
    """Import ``pieces[lane]`` into each lane the marker has not marked done (in parallel,
    see :func:`run_lanes`), marking lanes done as they end and the import complete at the
    end; counts and notes go into ``summary`` (an ``ImportSummary``). ``total(lanes)``:
    source rows of those lanes (the progress bar's total); ``name(lane)`` names a lane's
    piece in notes, ``unit`` counts pieces ("checkpoint(s)"). Ctrl-C stops at a block
    boundary and raises ``KeyboardInterrupt``. ``counts`` sums the lanes' ``counts``."""
    from ..storage.backends import backend_for
    from ..storage.format import write_import_marker
    from .progress import Progress, interruptible

    todo = [i for i in range(len(pieces)) if not marker["lanes"][str(i)]["done"]]
    if len(todo) < len(pieces):
        summary.notes.append(f"resumed a partial import: {len(pieces) - len(todo)} of "
                             f"{len(pieces)} {unit} were already imported")
    backend = backend_for(url, storage_options, fsync=True)
    prog = Progress(total(todo), desc, progress)

    def lane_done(res: LaneResult) -> None:
        summary.rows += res.rows
        summary.steps += res.steps
        summary.episodes += res.episodes
        summary.bytes_in += res.bytes_in
        if counts is not None:
            for k, v in (res.counts or {}).items():
                counts[k] = counts.get(k, 0) + v
        if res.resumed_rows:
            summary.notes.append(f"lane {res.lane} ({name(res.lane)}) resumed after its "
                                 f"{res.resumed_rows:,} stored rows")
        if not res.stopped:
            marker["lanes"][str(res.lane)]["done"] = True
            write_import_marker(backend, marker)

    try:
        with interruptible() as intr:
            run_lanes([(lane, pieces[lane]) for lane in todo], lane_fn, args,
                      workers=workers, progress=prog.update,
                      interrupted=lambda: intr.requested, lane_done=lane_done,
                      report_rows=report_rows)
            intr.check()
        marker["status"] = "complete"
        write_import_marker(backend, marker)
    finally:
        prog.close()
        backend.close()
