"""How warm a "warm" measurement was: a store's pages in the page cache, and what the
process fetched from the disk while it was timed.

A benchmark that reads a store's files once and then calls its reads warm assumes the
pages stay. On a machine that reclaims cold memory on its own they need not: the
machines these benchmarks ran on have DAMON page out physical memory not accessed for
~60 s, page cache included, at up to 128 MiB/s (``proactive_reclaim``). A 5 GB store
sampled uniformly touches each of its pages every ~15 s, too rarely to count as used: a
store read long before a run is partly read from the disk by it, and a long run can lose
pages as it goes. Memory pressure does the same where a store and the rest do not fit.

* ``resident_fraction(path)``: the fraction of the pages of the files under ``path`` that
  are in the page cache (``resident_pages``: ``mincore`` over a read-only mapping of each
  file).
* ``resident_pct`` and ``warmth_note()``: the column and the sentence a results section
  gives them.
* ``proactive_reclaim()``: a line naming the DAMON schemes that page memory out, or None.
* ``DiskMeter``: counts the calls of a step and the disk bytes this process read while it
  ran (``cold_cache.disk_read_bytes``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cold_cache import disk_read_bytes

_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_DAMON = Path("/sys/kernel/mm/damon/admin/kdamonds")


def status_mb(key: str) -> float:
    """One memory line of this process's ``/proc/self/status`` (``VmRSS``, ``VmHWM``,
    ``RssAnon``, ``RssFile``...), MiB; 0 where the kernel gives none."""
    with open("/proc/self/status") as f:
        line = next((x for x in f if x.startswith(key + ":")), None)
    return int(line.split()[1]) / 1024 if line else 0.0


def resident_pages(path: str | Path) -> tuple[int, int]:
    """(pages of file ``path`` in the page cache, pages of ``path``)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    pages = (size + _PAGE - 1) // _PAGE
    vec = ctypes.create_string_buffer(pages)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, np.uint8)  # (the mapping's address; nothing is read)
        failed = _libc.mincore(ctypes.c_void_p(view.ctypes.data), size, vec)
        del view
    if failed:
        raise OSError(ctypes.get_errno(), f"mincore failed on {path}")
    return int(np.count_nonzero(np.frombuffer(vec.raw, np.uint8) & 1)), pages


def resident_fraction(path: str | Path) -> float:
    """Fraction of the pages of the files under ``path`` in the page cache (0-1)."""
    held = total = 0
    for p in Path(path).rglob("*"):
        if p.is_file():
            h, t = resident_pages(p)
            held, total = held + h, total + t
    return held / total if total else 1.0


def resident_pct(before: float, path: str | Path) -> str:
    """``"before / now"``: the share of ``path``'s pages in the page cache (percent), as
    ``before`` (a :func:`resident_fraction`) and as it is now."""
    return f"{100 * before:.1f} / {100 * resident_fraction(path):.1f}"


def warmth_note() -> str:
    """The sentence a results section gives for the ``resident_pct`` and
    ``disk_kb_per_batch`` columns, with this machine's proactive reclaim."""
    return ("resident_pct = share of the store's file pages in the page cache right after "
            "reading them all / after the measurement (`mincore`); disk_kb_per_batch = kB "
            "the process fetched from the disk per timed batch (`/proc/self/io`). Proactive "
            f"reclaim on this machine: {proactive_reclaim() or 'none running'}.")


def proactive_reclaim() -> str | None:
    """A line naming the running DAMON schemes that page memory out (their minimum age in
    seconds and their quota), or None where none runs (or this cannot be read)."""
    found = []
    try:
        for kd in sorted(_DAMON.glob("[0-9]*")):
            if (kd / "state").read_text().strip() != "on":
                continue
            for ctx in sorted((kd / "contexts").glob("[0-9]*")):
                aggr_us = int((ctx / "monitoring_attrs/intervals/aggr_us").read_text())
                for sc in sorted((ctx / "schemes").glob("[0-9]*")):
                    if (sc / "action").read_text().strip() != "pageout":
                        continue
                    age = int((sc / "access_pattern/age/min").read_text()) * aggr_us / 1e6
                    quota = int((sc / "quotas/bytes").read_text())
                    ms = int((sc / "quotas/reset_interval_ms").read_text())
                    found.append(f"DAMON pages out memory unused for {age:.0f} s"
                                 + (f", up to {quota / 2**20:.0f} MiB per {ms} ms"
                                    if quota else ""))
    except (OSError, ValueError):
        return None
    return "; ".join(found) or None


class DiskMeter:
    """Wraps ``step``: ``meter()`` calls it, counting calls and the bytes this process
    fetched from the disk while the meter was on (``start()`` / ``stop()``)."""

    def __init__(self, step: Callable[[], Any]) -> None:
        self.step, self.calls, self.bytes, self._at = step, 0, 0, None

    def __call__(self) -> Any:
        if self._at is not None:
            self.calls += 1
        return self.step()

    def start(self) -> None:
        self._at = disk_read_bytes([os.getpid()])

    def stop(self) -> None:
        self.bytes += disk_read_bytes([os.getpid()]) - self._at
        self._at = None

    @property
    def kb_per_call(self) -> float:
        return self.bytes / 1e3 / max(1, self.calls)
