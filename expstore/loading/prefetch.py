"""``make_loader``'s in-process path: batches of a low-dim store read by a prefetch thread.

Where every field of a store is small (no frames) and its hot set holds every shard, a
batch is one C gather out of RAM without the GIL (``transition_batch.gather_from_hot_set``):
DataLoader worker processes would only add a copy through shared memory and a message
per item. Instead one daemon thread of this process plans and reads ``depth`` items
ahead with the store's own row source (its reader, staged rows included) into fresh
tensors (pinned where ``pin_memory`` and CUDA is there), and the loader hands them out
as the worker path does. The thread and ``Store.sample`` / ``Store.read_plan`` take the
store's read lock, so the reader is never used by two threads at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..sampling.base import Sampler
from .columns import numpy_alloc

_END = object()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def thread_path_fits(store: Any, sampler: Any) -> bool:
    """Whether ``make_loader`` reads in a prefetch thread (``threads=None``): a local store
    with no lane written by this process (a writer's ``add`` would change the index and
    staging under the thread), whose spec has no field stored one row per chunk (frames),
    whose hot set holds every shard of every field, read by a sampler without priorities
    (priority updates from the training loop would race the thread's plans)."""
    if getattr(store, "writers", True) or not getattr(store.backend, "is_local", False):
        return False
    if type(sampler).update_priorities is not Sampler.update_priorities:
        return False
    layout = store.layout
    if any(layout.chunk_rows(n) == 1 for n in layout.spec.fields):
        return False
    tables = store.reader.tables
    n_shards = layout.capacity // layout.shard_rows
    return all(n in tables and tables[n].max_slots == n_shards and tables[n].fills
               for n in layout.spec.fields)


def pinned_alloc(pin: bool):  # noqa: ANN201 - an Allocator
    """An allocator of arrays (every batch of a call carved out of one pinned tensor with
    ``pin``; plain numpy arrays without), which may be called again after a try that
    failed (``retryable``)."""
    if not pin:
        return numpy_alloc

    def alloc(specs: list) -> list[dict[str, np.ndarray]]:
        sizes = [[(k, shape, np.dtype(dtype), -(-int(np.prod(shape)) * np.dtype(dtype).itemsize
                                                // 64) * 64)
                  for k, (shape, dtype) in d.items()] for d in specs]
        raw = torch.empty(sum(n for d in sizes for *_, n in d), dtype=torch.uint8,
                          pin_memory=True).numpy()
        out, at = [], 0
        for d in sizes:
            arrays = {}
            for k, shape, dtype, n in d:
                size = int(np.prod(shape)) * dtype.itemsize
                arrays[k] = raw[at : at + size].view(dtype).reshape(shape)
                at += n
            out.append(arrays)
        return out

    alloc.retryable = True  # type: ignore[attr-defined]
    return alloc


class PrefetchThread:
    """Items of ``plans`` (a ``PlanGroups``) read by ``read(item) -> LocalBatches`` in a
    daemon thread under ``lock``, at most ``depth`` ahead; iterate to get them, in order.
    :meth:`close` stops the thread (also when the iterator is dropped)."""

    def __init__(self, plans: Any, read: Any, lock: Any, depth: int) -> None:
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self.stop = threading.Event()
        self._plans, self._read, self._lock = plans, read, lock
        self.thread = threading.Thread(target=self._run, name="expstore-prefetch",
                                       daemon=True)
        self.thread.start()

    def _put(self, x: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(x, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            it = iter(self._plans)
            while not self.stop.is_set():
                with self._lock:
                    item = next(it, _END)
                    got = _END if item is _END else self._read(item)
                if not self._put(got) or got is _END:
                    return
        except BaseException as e:  # handed to the consumer, raised there
            self._put(_Failed(e))

    def __iter__(self) -> Iterator[Any]:
        try:
            while True:
                got = self.queue.get()
                if got is _END:
                    return
                if isinstance(got, _Failed):
                    raise got.error
                yield got
        finally:
            self.close()

    def close(self) -> None:
        self.stop.set()
        while True:  # (frees a put waiting for room)
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
