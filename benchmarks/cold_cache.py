"""Keeping a store's pages out of the page cache while a benchmark reads it.

Two ways, one interface (a context manager with ``hold()`` and ``release()``):

* ``CacheBudget``: this process, and every process it forks afterwards, joins a memory
  cgroup of its own, used as a meter: a governor process outside it reads the group's
  page cache every 2 ms and, while it is past ``budget`` bytes, drops the pages of the
  store's files a sixteenth at a time, round robin. (A
  hard ``memory.limit_in_bytes`` at usage + budget was tried first: the loader's shared
  memory allocations then fail with ENOMEM instead of waiting for reclaim.) Needs a
  writable cgroup mount.
* ``Evictor``: a process calling ``posix_fadvise(DONTNEED)`` over every file of the store
  in a loop. Works anywhere, but under it ``make_loader``'s workers fetched twice the
  bytes per sample from the disk (12.2 against 6.2 KB), and its loop takes CPU from them.

``disk_read_bytes(pids)`` sums what the kernel fetched from the block device for those
processes (``/proc/PID/io``: ``read_bytes``): the proof that reads were cold.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.baselines import drop_page_cache


def store_files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def disk_read_bytes(pids: list[int]) -> int:
    """Bytes the kernel read from storage for ``pids`` so far (all their threads)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    total += int(line.split()[1])
    return total


def _memory_cgroup_dir() -> Path | None:
    """This process's memory cgroup directory, if one is mounted and writable."""
    with open("/proc/self/cgroup") as f:
        lines = [ln.rstrip("\n").split(":", 2) for ln in f]
    for _, controllers, rel in lines:
        if "memory" in controllers.split(","):
            d = Path("/sys/fs/cgroup/memory") / rel.lstrip("/")
            if (d / "memory.limit_in_bytes").exists() and os.access(d, os.W_OK):
                return d
    for _, controllers, rel in lines:  # cgroup v2: the unified hierarchy
        if controllers == "":
            d = Path("/sys/fs/cgroup") / rel.lstrip("/")
            if (d / "memory.max").exists() and os.access(d, os.W_OK):
                return d
    return None


def cgroup_available() -> bool:
    d = _memory_cgroup_dir()
    if d is None:
        return False
    probe = d / f"expstore-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    probe.rmdir()
    return True


class _Group:
    """One memory cgroup directory (v1 or v2), read as a meter of its page cache."""

    def __init__(self, path: Path) -> None:
        self.dir = path

    def cache_bytes(self) -> int:
        """The group's page cache on the file LRU lists (bytes; shared memory, through
        which the loader's tensors travel, sits on the anonymous lists)."""
        text = (self.dir / "memory.stat").read_text()
        stat = dict(line.split() for line in text.splitlines())
        return int(stat["inactive_file"]) + int(stat["active_file"])


def _govern(group: _Group, files: list[str], budget: int, period: float, slices: int,
            holding: Any, stop: Any, cache_peak: Any, passes: Any, seen: Any) -> None:
    """Every ``period`` s while ``holding``: when the group's page cache passes ``budget``
    bytes, drop the pages of the next ``1 / slices`` of the store's files (round robin:
    a page lives about ``slices`` drops, not until the next pass over every file, which
    in ``make_loader`` doubled the bytes the disk served per sample). Runs outside the
    group (its own reads are not counted)."""
    fds = [os.open(p, os.O_RDONLY) for p in files]
    step = -(-len(fds) // slices)
    at = 0
    while not stop.wait(period):
        if not holding.value:
            continue
        cache = group.cache_bytes()
        cache_peak.value = max(cache_peak.value, cache)
        seen[0] += cache
        seen[1] += 1
        if cache > budget:
            for fd in fds[at : at + step]:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            at = (at + step) % len(fds)
            passes.value += 1


class CacheBudget:
    """This process (and what it forks from now on) in a memory cgroup of its own, whose
    page cache a governor process outside it watches every ``period`` seconds while
    ``hold()`` is in force: past ``budget`` bytes, it drops the store's pages. The cgroup
    is the meter (one read per period); the dropping costs a pass over the store's files
    only when the budget is passed."""

    name = "cgroup"

    def __init__(self, path: Path, budget: int, period: float = 0.002,
                 slices: int = 16) -> None:
        parent = _memory_cgroup_dir()
        if parent is None:
            raise RuntimeError("no writable memory cgroup here; use the evictor")
        self.path, self.budget, self.period = path, budget, period
        self.parent = parent
        self.group = _Group(parent / f"expstore-bench-cold-{os.getpid()}")
        ctx = mp.get_context("fork")
        self.holding, self.stop = ctx.Value("b", 0), ctx.Event()
        self._cache_peak, self._passes = ctx.Value("q", 0), ctx.Value("q", 0)
        self._seen = ctx.Array("d", 2)  # sum of the page cache seen (bytes), readings
        self.proc = ctx.Process(target=_govern, daemon=True, args=(
            self.group, [str(p) for p in store_files(path)], budget, period, slices,
            self.holding, self.stop, self._cache_peak, self._passes, self._seen))
        self.held_s = 0.0

    @property
    def cache_peak(self) -> int:
        """Most page cache the governor saw in the group (bytes)."""
        return self._cache_peak.value

    @property
    def cache_mean(self) -> float:
        """Mean page cache the governor saw in the group while holding (bytes)."""
        return self._seen[0] / max(self._seen[1], 1)

    @property
    def rate(self) -> float:
        """Drops (of a slice of the files) per second held."""
        return self._passes.value / max(self.held_s, 1e-9)

    def hold(self) -> None:
        """Drop the store's pages, then keep the group's page cache near ``budget``."""
        os.sync()  # (a dirty page is not dropped)
        drop_page_cache(self.path)
        self.t0 = time.perf_counter()
        self.holding.value = 1

    def release(self) -> None:
        if self.holding.value:
            self.holding.value = 0
            self.held_s += time.perf_counter() - self.t0

    def __enter__(self) -> CacheBudget:
        self.group.dir.mkdir()
        self.proc.start()  # before joining: the governor stays outside the group
        (self.group.dir / "cgroup.procs").write_text(str(os.getpid()))
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.stop.set()
        self.proc.join()
        (self.parent / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(50):  # forked workers may still be leaving
            try:
                self.group.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _evict_loop(paths: list[str], interval: float, stop: Any, passes: Any) -> None:
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    while not stop.is_set():
        for fd in fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        passes.value += 1
        time.sleep(interval)


class Evictor:
    """A process dropping the store's pages from the page cache, pass after pass, while
    ``hold()`` is in force."""

    name = "evictor"

    def __init__(self, path: Path, interval: float) -> None:
        self.files, self.interval = store_files(path), interval
        self.proc: Any = None
        self.rate = 0.0

    def hold(self) -> None:
        ctx = mp.get_context("fork")
        self.stop, self.passes = ctx.Event(), ctx.Value("q", 0)
        self.proc = ctx.Process(target=_evict_loop, daemon=True,
                                args=([str(p) for p in self.files], self.interval,
                                      self.stop, self.passes))
        self.proc.start()
        self.t0 = time.perf_counter()

    def release(self) -> None:
        if self.proc is None:
            return
        self.stop.set()
        self.proc.join()
        self.rate = self.passes.value / (time.perf_counter() - self.t0)
        self.proc = None

    def __enter__(self) -> Evictor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
