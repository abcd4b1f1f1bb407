"""Rows staged but not flushed, in shared memory: readers on this machine see them at once.

A writer of a local store keeps its lane's staging buffers (the open shard and the full
shards waiting for the background write) in one file under ``/dev/shm`` per lane, named
from a hash of the store's real path and the lane (:func:`staging_path`). Layout::

    [ header: 4096 B ]  [ buffer 0: field 0 rows | field 1 rows | ... ]  [ buffer 1 ] ...

The header holds int64 words: magic, version, a hash of the layout (fields, shapes,
dtypes, rows per buffer), the writer's pid, process start time and boot id, a random
session number, the count it last committed, a ``closed`` flag, and per buffer a
generation ``gen``, its ``first_step`` and the rows published ``n``. The writer publishes a
row by writing all its fields, then ``n`` (so ``n`` is written after the row data). A
buffer is recycled for another shard only after its rows were committed: ``gen`` becomes
odd, ``first_step`` and ``n`` change, ``gen`` becomes even again.

**Readers** (another process's ``Store.refresh()``, DataLoader workers) read a row of
step ``s`` from a buffer whose ``first_step <= s < first_step + n``: they copy the values,
then re-read the staged ``_step_id`` of those rows and ``gen``; a row counts only if its
``_step_id`` is ``s`` and ``gen`` did not change (a seqlock: the copy raced no recycling).
A reader uses a file only when its writer is alive (pid, start time and boot id match a
running process), the session is the one it planned with, and the layout hash matches;
a killed writer's file is ignored and replaced by the lane's next writer (rename over
it). A writer closing cleanly sets ``closed`` and unlinks the file. Stores that are not
on this machine's disk (``s3://``, ``memory://``) stage in private memory, as before.

This needs stores (and ``n``) to become visible in program order, as on x86-64.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import re
import time
import weakref
from typing import Any

import numpy as np

from ..format import Layout

SHM_DIR = "/dev/shm"
#: ``EXPSTORE_SHARED_STAGING=0`` turns shared-memory staging off (writers and readers)
ENABLED = os.environ.get("EXPSTORE_SHARED_STAGING", "1") != "0"
MAGIC = int.from_bytes(b"EXPSSTG1", "little")
VERSION = 1
HEADER_BYTES = 4096
ALIGN = 64
# header words (int64)
_MAGIC, _VERSION, _LAYOUT, _PID, _START, _BOOT, _SESSION, _K, _ROWS, _COMMITTED, _CLOSED = \
    range(11)
_BUF0 = 16  # buffer b: words _BUF0 + 4b .. (gen, first_step, n, unused)
N_WORD = 2  # of those, the rows published
MAX_BUFFERS = (HEADER_BYTES // 8 - _BUF0) // 4


def staging_path(root: str, lane: int) -> str:
    """The shared-memory file of ``lane`` of the local store at ``root``."""
    real = os.path.realpath(root)
    h = hashlib.blake2b(real.encode(), digest_size=8).hexdigest()
    return os.path.join(SHM_DIR, f"expstore-{h}-lane{lane}")


def _layout_hash(layout: Layout, n_buffers: int) -> int:
    desc = [layout.shard_rows, n_buffers,
            [(n, list(f.shape), f.dtype.str) for n, f in layout.fields.items()]]
    h = hashlib.blake2b(json.dumps(desc).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little", signed=True)


def _plan(layout: Layout, n_buffers: int) -> tuple[list[dict[str, int]], int]:
    """Byte offset of each buffer's field arrays, and the file size."""
    S = layout.shard_rows
    at = HEADER_BYTES
    out = []
    for _ in range(n_buffers):
        offs = {}
        for name, f in layout.fields.items():
            offs[name] = at
            nbytes = S * f.dtype.itemsize * int(np.prod(f.shape, dtype=np.int64))
            at += -(-nbytes // ALIGN) * ALIGN
        out.append(offs)
    return out, at


def _views(mm: Any, layout: Layout, offsets: list[dict[str, int]]) -> list[dict[str, np.ndarray]]:
    S = layout.shard_rows
    return [{name: np.ndarray((S, *f.shape), f.dtype, buffer=mm, offset=offs[name])
             for name, f in layout.fields.items()} for offs in offsets]


def _boot_id() -> int:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            raw = f.read().strip()
    except OSError:
        return 0
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little", signed=True)


BOOT = _boot_id()


def _start_ticks(pid: int) -> tuple[int, bytes] | None:
    """(start time in clock ticks since boot, state letter) of a process, ``None`` if it
    does not exist; (-1, b"?") where ``/proc`` cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return -1, b"?"
    rest = raw[raw.rindex(b")") + 2:].split()
    return int(rest[19]), rest[0]


def writer_alive(pid: int, start: int, boot: int) -> bool:
    """Whether the process that wrote a staging file still runs (not a zombie)."""
    if boot != BOOT:
        return False
    got = _start_ticks(pid)
    if got is None:
        return False
    ticks, state = got
    if ticks == -1:  # no /proc: signal 0 tells whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return ticks == start and state not in (b"Z", b"X", b"x")


class SharedStaging:
    """The writer's side: ``buffers[b][field]`` arrays of ``shard_rows`` rows in ``/dev/shm``.

    Made with :meth:`create` (``None`` where there is no room or no ``/dev/shm``).
    """

    def __init__(self, path: str, mm: mmap.mmap, layout: Layout, n_buffers: int,
                 session: int) -> None:
        self.path = path
        self.mm = mm
        self.layout = layout
        self.session = session
        self.pid = os.getpid()
        self.words = np.ndarray((HEADER_BYTES // 8,), np.int64, buffer=mm)
        #: the buffers' words as a memoryview (``published[4 * b + N_WORD] = n`` is the
        #: cheapest store Python has: the writer publishes every row)
        self.published = memoryview(mm)[_BUF0 * 8: HEADER_BYTES].cast("q")
        offsets, _ = _plan(layout, n_buffers)
        self.buffers = _views(mm, layout, offsets)
        self.ino = os.stat(path).st_ino
        # a writer collected, or alive at exit, without close(): its rows are not durable
        self._finalizer = weakref.finalize(self, _remove, path, self.ino, self.pid)

    @classmethod
    def create(cls, root: str, lane: int, layout: Layout, n_buffers: int
               ) -> SharedStaging | None:
        global _swept
        if not _swept:
            _swept = True
            sweep()
        n_buffers = min(n_buffers, MAX_BUFFERS)
        path = staging_path(root, lane)
        _, size = _plan(layout, n_buffers)
        try:
            st = os.statvfs(SHM_DIR)
            if st.f_bavail * st.f_frsize < 2 * size:  # leave room for others
                return None
        except OSError:
            return None
        tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:
            return None
        try:
            os.ftruncate(fd, size)
            # reserve the pages now: a full /dev/shm must fail here, not SIGBUS a write later
            os.posix_fallocate(fd, 0, size)
            # mapped at once (MAP_POPULATE): no page faults inside the adds that stage rows
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                           mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.remove(tmp)
            return None
        os.close(fd)
        session = int.from_bytes(os.urandom(8), "little", signed=True) or 1
        w = np.ndarray((HEADER_BYTES // 8,), np.int64, buffer=mm)
        got = _start_ticks(os.getpid())
        w[_VERSION], w[_LAYOUT] = VERSION, _layout_hash(layout, n_buffers)
        w[_PID], w[_START], w[_BOOT] = os.getpid(), got[0] if got else -1, BOOT
        w[_SESSION], w[_K], w[_ROWS] = session, n_buffers, layout.shard_rows
        for b in range(n_buffers):
            w[_BUF0 + 4 * b: _BUF0 + 4 * b + 3] = (0, -1, 0)
        w[_MAGIC] = MAGIC
        del w
        try:
            os.replace(tmp, path)  # a dead writer's file (or none) is replaced at once
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            return None
        return cls(path, mm, layout, n_buffers, session)

    def begin(self, b: int, first_step: int) -> None:
        """Buffer ``b`` now stages the shard starting at ``first_step`` (no rows yet)."""
        w, i = self.words, _BUF0 + 4 * b
        w[i] += 1  # odd: changing
        w[i + 1] = first_step
        w[i + 2] = 0
        w[i + 0] += 1

    def publish(self, b: int, n: int) -> None:
        """Rows ``0 .. n`` of buffer ``b`` are written."""
        self.published[4 * b + N_WORD] = n

    def set_committed(self, count: int) -> None:
        self.words[_COMMITTED] = count

    def close(self) -> None:
        """Say so to readers and unlink the file (if it is still ours); the creating
        process only (a forked child leaves its parent's file alone)."""
        if os.getpid() != self.pid:
            return
        self.words[_CLOSED] = 1
        self._finalizer()


def _remove(path: str, ino: int, pid: int) -> None:
    if os.getpid() != pid:
        return
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == ino:
            os.remove(path)


_swept = False  # this process looked for dead writers' files already
_NAME = re.compile(r"^expstore-[0-9a-f]{16}-lane[0-9]+(\.[0-9]+\.[0-9a-f]+\.tmp)?$")


def sweep() -> int:
    """Remove staging files (and half-made ones) of writers that died without closing:
    nobody reads them (readers ignore a dead writer's file), and a killed writer's file
    would otherwise stay in ``/dev/shm`` until its lane's next writer replaces it."""
    removed = 0
    try:
        names = [n for n in os.listdir(SHM_DIR) if _NAME.match(n)]
    except OSError:
        return 0
    for name in names:
        path = os.path.join(SHM_DIR, name)
        try:
            if name.endswith(".tmp"):  # expstore-<hash>-lane<i>.<pid>.<rand>.tmp
                pid = int(name.split(".")[-3])
                if _start_ticks(pid) is None:
                    os.remove(path)
                    removed += 1
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                raw = os.pread(fd, 8 * (_CLOSED + 1), 0)
            finally:
                os.close(fd)
            w = np.frombuffer(raw, np.int64)
            if len(w) == _CLOSED + 1 and int(w[_MAGIC]) == MAGIC and (
                    w[_CLOSED] or not writer_alive(int(w[_PID]), int(w[_START]),
                                                   int(w[_BOOT]))):
                os.remove(path)
                removed += 1
        except (OSError, ValueError, IndexError):
            continue
    return removed


class _Mapped:
    """A reader's mapping of one lane's staging file."""

    def __init__(self, path: str, layout: Layout) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            self.ino = (st.st_dev, st.st_ino)
            if st.st_size < HEADER_BYTES:
                raise ValueError("truncated")
            self.mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        w = np.ndarray((HEADER_BYTES // 8,), np.int64, buffer=self.mm)
        self.words = w
        K = int(w[_K])
        if (int(w[_MAGIC]) != MAGIC or int(w[_VERSION]) != VERSION or not 0 < K <= MAX_BUFFERS
                or int(w[_LAYOUT]) != _layout_hash(layout, K)):
            raise ValueError("not a staging file of this layout")
        offsets, size = _plan(layout, K)
        if st.st_size < size:
            raise ValueError("truncated")
        self.K = K
        self.session = int(w[_SESSION])
        self.buffers = _views(self.mm, layout, offsets)
        self.checked = 0.0
        self.live = True

    def alive(self) -> bool:
        w = self.words
        return not w[_CLOSED] and writer_alive(int(w[_PID]), int(w[_START]), int(w[_BOOT]))

    @property
    def committed(self) -> int:
        return int(self.words[_COMMITTED])

    def spans(self) -> list[tuple[int, int, int, int]]:
        """(buffer, gen, first_step, n) of every buffer not being recycled."""
        w = self.words
        out = []
        for b in range(self.K):
            i = _BUF0 + 4 * b
            g, fs, n = int(w[i]), int(w[i + 1]), int(w[i + 2])
            if g % 2 == 0 and fs >= 0 and n > 0:
                out.append((b, g, fs, n))
        return out

    def read(self, name: str, steps: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Copy rows of ``steps`` held here into ``out``; a mask of rows delivered."""
        ok = np.zeros(len(steps), bool)
        w = self.words
        for b, g, fs, n in self.spans():
            sel = np.flatnonzero((steps >= fs) & (steps < fs + n) & ~ok)
            if not len(sel):
                continue
            slots = steps[sel] - fs
            buf = self.buffers[b]
            out[sel] = buf[name][slots]
            ids = buf["_step_id"][slots]  # read after the values: a recycled row shows here
            if int(w[_BUF0 + 4 * b]) != g:  # recycled during the copy
                continue
            ok[sel] = ids == steps[sel]
        return ok

    def top(self, start: int) -> int:
        """End of the steps held contiguously from ``start`` (``start`` if none)."""
        spans = sorted((fs, fs + n) for _, _, fs, n in self.spans())
        end = start
        for fs, stop in spans:
            if fs <= end < stop:
                end = stop
        return end


class StagedLanes:
    """A reader's view of the staging files of one local store's writers (this machine).

    ``lane(i)`` maps the current file of lane ``i`` (re-checking the path and the writer's
    liveness at most every ``recheck`` seconds; ``0``: every call) or gives ``None``.
    """

    def __init__(self, root: str, layout: Layout, recheck: float = 0.05) -> None:
        self.root = root
        self.layout = layout
        self.recheck = recheck
        self.maps: dict[int, _Mapped | None] = {}
        self.looked: dict[int, float] = {}
        self.pid = os.getpid()

    def lane(self, lane: int, recheck: float | None = None) -> _Mapped | None:
        if self.pid != os.getpid():  # a forked child maps its own
            self.maps.clear()
            self.looked.clear()
            self.pid = os.getpid()
        now = time.monotonic()
        age = self.recheck if recheck is None else recheck
        if lane in self.looked and now - self.looked[lane] < age:
            m = self.maps.get(lane)
            return m if m is not None and m.live else None
        self.looked[lane] = now
        path = staging_path(self.root, lane)
        m = self.maps.get(lane)
        try:
            st = os.stat(path)
        except OSError:
            self.maps[lane] = None
            return None
        if m is None or m.ino != (st.st_dev, st.st_ino):
            try:
                m = _Mapped(path, self.layout)
            except (OSError, ValueError):
                m = None
            self.maps[lane] = m
        if m is not None:
            m.live = m.alive()
            if not m.live:
                return None
        return m

    def read(self, lane: int, session: int, name: str, steps: np.ndarray,
             out: np.ndarray) -> tuple[np.ndarray, int]:
        """Rows of ``lane`` at ``steps`` staged by writer ``session``: (delivered mask, the
        count that writer had committed when they were read; -1 if none)."""
        m = self.lane(lane)
        if m is None or m.session != session:
            return np.zeros(len(steps), bool), -1
        ok = m.read(name, steps, out)
        return ok, m.committed
