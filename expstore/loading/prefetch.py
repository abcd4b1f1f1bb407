"""Reading ahead in a background thread: :class:`Prefetch` (any iterator; the dataset
importers' blocks too) and ``make_loader``'s in-process path on it.

Where every field of a store is small (no frames) and its hot set holds every shard, a
batch is one C gather out of RAM without the GIL (``hot_batch.gather_from_hot_set``):
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

from ..sampling.base import Sampler
from .columns import numpy_alloc

_END = object()


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
    whole = store.reader.held_whole  # (None for frames: one row per chunk)
    return all(whole.get(n) for n in store.layout.spec.fields)


def pinned_alloc(pin: bool):  # noqa: ANN201 - an Allocator
    """Where the prefetch thread writes batches: every batch of a call carved out of one
    pinned tensor with ``pin`` (:func:`carving_alloc`), plain numpy arrays without."""
    if not pin:
        return numpy_alloc
    import torch  # (loaded on first use, as loader.py is)

    return carving_alloc(lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True).numpy())


def carving_alloc(buffer: Any):  # noqa: ANN201 - an Allocator
    """An allocator whose every call carves its arrays, each 64-byte aligned, out of one
    ``buffer(nbytes)`` (uint8); ``retryable``: it may be called again after a try that
    failed (``hot_batch.gather_from_hot_set`` writes into it directly)."""

    def alloc(specs: list) -> list[dict[str, np.ndarray]]:
        sizes = [[(k, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
                  for k, (shape, dtype) in d.items()] for d in specs]
        raw = buffer(sum(-(-n // 64) * 64 for d in sizes for *_, n in d))
        out, at = [], 0
        for d in sizes:
            arrays = {}
            for k, shape, dtype, n in d:
                arrays[k] = raw[at : at + n].view(dtype).reshape(shape)
                at += -(-n // 64) * 64
            out.append(arrays)
        return out

    alloc.retryable = True  # type: ignore[attr-defined]
    return alloc


def locked_reads(plans: Any, read: Any, lock: Any) -> Iterator[Any]:
    """``read(item)`` of each item of ``plans``, both drawn under ``lock``."""
    it = iter(plans)
    while True:
        with lock:
            item = next(it, _END)
            if item is _END:
                return
            got = read(item)
        yield got


class Prefetch:
    """Run an iterator in a background thread, ``depth`` items ahead (I/O and inflate
    release the GIL, so reading overlaps the store's encoding). Exceptions re-raise in
    the consumer; :meth:`close` stops the thread."""

    _END = object()

    def __init__(self, it: Iterator[Any], depth: int = 2) -> None:
        self._q: Any = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._it = it
        self._thread = threading.Thread(target=self._run, name="expstore-prefetch",
                                        daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._it:
                if not self._put((True, item)):
                    return
            self._put((True, self._END))
        except BaseException as e:  # handed to the consumer
            self._put((False, e))
        finally:
            close = getattr(self._it, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Iterator[Any]:
        while True:
            ok, item = self._q.get()
            if not ok:
                raise item
            if item is self._END:
                return
            yield item

    def close(self) -> None:
        self._stop.set()
        try:
            while True:
                self._q.get_nowait()
        except queue.Empty:
            pass
        self._thread.join()

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
