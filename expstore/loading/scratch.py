"""Batch buffers used again by later batches once nothing refers to them.

A batch of stacked frames reads its distinct frames into one buffer (~9 MB for 256 Atari
samples) and copies stacks out of it into the batch's arrays (7.2 MB per stacked column).
Fresh arrays of that size are fresh memory: the allocator hands them back to the system
when they are freed, so every batch page-faulted and zeroed its memory again, and on a
100k-frame MsPacman store that took about half of `sample(256)` (benchmarks/RESULTS.md,
"Issue 26: read path, status").

A buffer here is taken again only when no array refers to it any more (its reference
count: the pool's own reference alone), so a batch the caller keeps, a view of it, a
tensor made from it or a ``Gathered`` column not yet written out keeps it. Each thread has
its own pool (a DataLoader worker is a process, the prefetch thread a thread of its own).
Where reference counts do not say that (checked at import: a free-threaded Python, or an
interpreter that skips counts), every call allocates.
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np

#: buffers below this many bytes are allocated as usual (below glibc's default mmap threshold,
#: 128 KiB, the allocator reuses freed memory itself)
MIN_BYTES = 128 << 10
#: at most this many bytes of buffers kept per thread, besides those in use (checked at
#: each call)
MAX_KEPT_BYTES = 64 << 20
#: at most this many bytes in a thread's pool, buffers in use included: past it, arrays are
#: allocated outside the pool (a caller keeping many batches)
MAX_POOL_BYTES = 4 * MAX_KEPT_BYTES


class _Pool(threading.local):
    def __init__(self) -> None:
        self.buffers: list[np.ndarray] = []  # uint8, each owned by this pool alone when free


_pool = _Pool()


def _count(buffers: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(buffers[i])


def _alone_count() -> int | None:
    """What :func:`_count` says of a buffer only the pool refers to, if a view of it
    raises that by one and dropping the view lowers it again; else None."""
    if not getattr(sys, "_is_gil_enabled", lambda: True)():
        return None  # (a free-threaded build defers some counts)
    probe = [np.empty(1, np.uint8)]
    alone = _count(probe, 0)
    view = probe[0][:]
    held = _count(probe, 0)
    del view
    return alone if held == alone + 1 and _count(probe, 0) == alone else None


_ALONE = _alone_count()


def _unused(buffers: list[np.ndarray], i: int) -> bool:
    return _count(buffers, i) == _ALONE


def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array like ``np.empty(shape, dtype)``, by :func:`arrays`' rule."""
    return arrays({"": (shape, dtype)})[""]


def arrays(specs: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, np.ndarray]:
    """Uninitialised arrays like ``np.empty(shape, dtype)`` for a batch's ``{name: (shape,
    dtype)}``: those of at least :data:`MIN_BYTES` in buffers of this thread's pool that
    nothing refers to any more, where there is one large enough. (One call per batch, the
    rule inline: a batch has ~10 arrays, most of them small, and a call per array cost
    ~3 µs each on a slow machine.)"""
    out = {}
    for name, (shape, dtype) in specs.items():
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize  # (np.prod of a tuple costs microseconds)
        out[name] = (np.empty(shape, dtype) if nbytes < MIN_BYTES or _ALONE is None
                     else _pooled(shape, dtype, nbytes))
    return out


def _pooled(shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
    buffers = _pool.buffers
    best = -1
    for i in range(len(buffers)):
        if buffers[i].nbytes >= nbytes and _unused(buffers, i) and (
                best < 0 or buffers[i].nbytes < buffers[best].nbytes):
            best = i
    if best >= 0:
        buf = buffers[best]
    else:
        buf = np.empty(nbytes + (nbytes >> 3), np.uint8)  # (room for a larger batch)
        if sum(b.nbytes for b in buffers) + buf.nbytes > MAX_POOL_BYTES:
            _trim(buffers)
            if sum(b.nbytes for b in buffers) + buf.nbytes > MAX_POOL_BYTES:
                return buf[:nbytes].view(dtype).reshape(shape)  # (not kept)
        buffers.append(buf)
    _trim(buffers)  # (``buf`` is referred to here: not dropped)
    return buf[:nbytes].view(dtype).reshape(shape)


def _trim(buffers: list[np.ndarray]) -> None:
    """Drop unused buffers, smallest first, while the pool holds more than
    :data:`MAX_KEPT_BYTES` (buffers in use are kept)."""
    while sum(b.nbytes for b in buffers) > MAX_KEPT_BYTES:
        free = [i for i in range(len(buffers)) if _unused(buffers, i)]
        if not free:
            return
        buffers.pop(min(free, key=lambda i: buffers[i].nbytes))
