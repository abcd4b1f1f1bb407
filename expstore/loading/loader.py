"""Streaming batches into PyTorch: the sampler in the main process, workers read and decode.

``make_loader`` returns a :class:`StoreLoader`, a real ``torch.utils.data.DataLoader``.
Its ``batch_sampler`` (:class:`PlanGroups`) draws read plans from an expstore sampler in
the main process: rows and the lane steps expected there, a few integers per sample. One
DataLoader item is ``batches_per_message`` plans (default: about 512 samples' worth), so
the per-item cost of DataLoader's queues is shared by small batches. A worker executes
the item in one ``__getitems__`` call against storage (no index, no IPC back), and, on a
local store, the writers' shared-memory staging for rows not committed when the item was
planned (``store_rows.StoreRows``, the same rule the store's own process reads by):
checks every row's step, replaces overwritten samples with spares, and writes the
batches into one of its shared-memory slots (``transport``): frame stacks are gathered
straight into the slot, and the main process receives only the slot's number.

Priority updates (``sampler.update_priorities``) happen in the main process and affect the
next plan drawn; plans already drawn are at most ``num_workers * prefetch_factor *
batches_per_message`` batches ahead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..errors import StaleBatchError
from ..sampling.base import STALE_REPLANS, Sampler, check_batch
from ..sampling.mixture import MixtureSampler
from ..sampling.plans import ReaderView, ReadPlan
from ..sampling.uniform import UniformSampler
from ..storage.format import Layout
from ..validate import check_bytes
from .columns import RowSource, numpy_alloc
from .execute import assemble_batches
from .plan_groups import PlanGroups
from .prefetch import Prefetch, locked_reads, pinned_alloc, thread_path_fits
from .skip_corrupt import SkipCorruptSource, quarantine_lap, skipping_in_process
from .store_rows import StoreRows
from .transport import Message, SlotWriter, forget_worker, open_message
from .worker_exit import WORKER_ERRORS, forget_worker_pids, worker_death

_STATS_KEY = "_expstore_stats"
_ALL_STALE = "_expstore_all_stale"
#: chunks a reading process found corrupt since its last message, handed back with the
#: batches: up to this many per message as (field number, shard, chunk (-1: the whole
#: shard), lap's first step), -1 after
_CORRUPT = "_expstore_corrupt"
_CORRUPT_SLOTS = 16
_STAT_NAMES = ("batches", "rows_read", "chunks_read", "bytes_read", "requests",
               "read_seconds", "cache_hits", "cache_misses", "corrupt_rows_skipped",
               "stale_replaced")


@dataclass
class LoaderStats:
    """Totals since the loader was made (rows, bytes, seconds). ``batches``: handed to the
    consumer; the read counters cover every message received from the workers (which
    may hold batches not handed out yet)."""

    batches: int = 0
    rows_read: int = 0
    chunks_read: int = 0
    bytes_read: int = 0
    requests: int = 0
    read_seconds: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    stale_replaced: int = 0
    #: rows not delivered because their chunk failed its checks (``skip_corrupt=True``;
    #: draws planned before the chunk was reported)
    corrupt_rows_skipped: int = 0
    #: corrupt chunks reported by the readers, each once per lap (``skip_corrupt=True``; a
    #: shard whose index or header fails counts as one)
    corrupt_shards: int = 0
    #: rows of those chunks taken out of sampling, each counted once
    corrupt_rows_quarantined: int = 0
    #: shared-memory buffers workers had to create (slots filled or grown at the start,
    #: later only when the consumer still holds every slot's batch; see ``transport``)
    new_buffers: int = 0

    @property
    def cache_hit_rate(self) -> float:
        n = self.cache_hits + self.cache_misses
        return self.cache_hits / n if n else 0.0

    def add(self, d: dict[str, float]) -> None:
        for name, v in d.items():
            old = getattr(self, name, None)
            if old is not None:
                setattr(self, name, old + type(old)(v))

    def as_dict(self) -> dict[str, float]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["cache_hit_rate"] = self.cache_hit_rate
        return out


class StoreDataset(torch.utils.data.Dataset):
    """Picklable reader of a store: opens it read-only, lazily, once per worker process."""

    def __init__(self, url: str, layout: Layout, storage_options: dict | None = None,
                 cache_bytes: int = 256 << 20,
                 local_source: Callable[[], RowSource] | None = None,
                 pack: bool = False, n_slots: int = 8, skip_corrupt: bool = False,
                 hot_bytes: int = 512 << 20, map_bytes: int = 0,
                 entry_bytes: int | None = None) -> None:
        self.skip_corrupt = skip_corrupt  # wrap sources in SkipCorruptSource (skip_corrupt.py)
        self._skipping: SkipCorruptSource | None = None
        self.url = url
        self.layout = layout
        self.storage_options = storage_options
        self.cache_bytes = cache_bytes
        self.hot_bytes = hot_bytes  # a worker's hot set (decoded small fields), bytes
        self.map_bytes = map_bytes  # a worker's mapped frame shards, bytes per frame field
        self.entry_bytes = entry_bytes  # a worker's held chunk offsets, bytes per frame field
        self.pack = pack  # write batches into shared slots (worker processes, see transport)
        self.n_slots = n_slots
        self.token = int.from_bytes(os.urandom(6), "little")
        self._writer: SlotWriter | None = None
        #: num_workers=0: ``() -> the store's own row source`` (staged rows included)
        self._local_source = local_source
        self._reader = None
        self._shared: Any = None  # the writers' shared staging (``StagedLanes``), lazily
        self._pid = -1

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_reader"], d["_local_source"], d["_pid"], d["_writer"] = None, None, -1, None
        d["_shared"] = None
        d["_skipping"] = None
        return d

    def _source(self, staged: Any = None) -> Any:
        """Where this process reads (see :meth:`_plain_source`), skipping corrupt shards
        with ``skip_corrupt`` (one in-memory quarantine per process; the chunks it finds
        go back to the loader's process, which logs and quarantines them)."""
        source = self._plain_source(staged)
        if not self.skip_corrupt:
            return source
        self._skipping = skipping_in_process(self._skipping, source, self.layout)
        return self._skipping

    def _plain_source(self, staged: Any = None) -> Any:
        """Where this process reads: the store's own rows (no workers), else its shard
        reader, merged with the rows staged in shared memory where the plans include some
        (``staged``: the item's :class:`~expstore.loading.store_rows.StagedSnapshot`)."""
        if self._local_source is not None:
            return self._local_source()
        if self._reader is None or self._pid != os.getpid():
            from ..storage.backends import backend_for
            from ..storage.read import ShardReader

            backend = backend_for(self.url, self.storage_options)
            self._reader = ShardReader(backend, self.layout, chunk_cache_bytes=self.cache_bytes,
                                       row_cache_bytes=self.cache_bytes,
                                       values_budget=self.hot_bytes,
                                       map_bytes=self.map_bytes,
                                       entry_bytes=self.entry_bytes)
            self._shared = None
            self._pid = os.getpid()
        if staged is None or not staged[0].any():
            return self._reader
        if self._shared is None:
            from ..storage.write import StagedLanes

            self._shared = StagedLanes(self._reader.backend.root, self.layout)
        return StoreRows.in_worker(self._reader, self._shared, self.layout.lane_capacity,
                                   staged)

    def __len__(self) -> int:
        return self.layout.capacity

    def __getitem__(self, plan: ReadPlan) -> Any:
        return self.__getitems__([plan])

    def __getitems__(self, plans: list[ReadPlan]) -> Any:
        return self.read(plans, self.pack)

    def read(self, plans: list[ReadPlan], pack: bool,
             arrays_alloc: Callable[[list], list[dict[str, np.ndarray]]] = numpy_alloc
             ) -> Message | LocalBatches:
        """Every batch of ``plans``; ``pack``: written into a shared slot (a worker), else
        into arrays of ``arrays_alloc`` (a ``columns.Allocator``)."""
        source = self._source(getattr(plans, "staged", None))
        stats = getattr(source, "stats", None)
        before = _snapshot(stats)
        skipped = source.found.rows_skipped if isinstance(source, SkipCorruptSource) else 0
        t0 = _now()
        n = sum(getattr(p, "batches", 1) for p in plans)
        host_specs = {_STATS_KEY: ((len(_STAT_NAMES),), np.dtype(np.float64)),
                      _ALL_STALE: ((n,), np.dtype(bool)),
                      _CORRUPT: ((_CORRUPT_SLOTS, 4), np.dtype(np.int64))}
        host: dict[str, np.ndarray] = {}
        writer = self._slots() if pack else None

        def alloc(specs: list) -> list[dict[str, np.ndarray]]:
            if pack:
                arrays = writer([*specs, host_specs])
                host.update(arrays.pop())
                return arrays
            host.update(numpy_alloc([host_specs])[0])
            return arrays_alloc(specs)

        alloc.retryable = not pack and getattr(arrays_alloc, "retryable",  # type: ignore
                                               arrays_alloc is numpy_alloc)

        if len(plans) == 1:  # one plan of one or more batches: written in place
            results = assemble_batches(plans[0], self.layout, source, alloc)
        else:  # plans of their own kind (sequences, ...): assembled, then copied in
            results = [r for p in plans for r in assemble_batches(p, self.layout, source)]
            arrays = alloc([{} if b is None else {k: (v.shape, v.dtype) for k, v in b.items()}
                            for b, _ in results])
            for (b, _), out in zip(results, arrays):
                for k, v in (b or {}).items():
                    out[k][...] = v
            results = [(None if b is None else out, st) for (b, st), out in zip(results, arrays)]
        after = _snapshot(stats)
        host[_ALL_STALE][:] = [b is None for b, _ in results]
        host[_STATS_KEY][:] = [len(results), *(a - b for a, b in zip(after[:4], before[:4])),
                               _now() - t0, after[4] - before[4], after[5] - before[5],
                               (source.found.rows_skipped - skipped
                                if isinstance(source, SkipCorruptSource) else 0),
                               sum(st for _, st in results)]
        host[_CORRUPT][:] = -1
        if isinstance(source, SkipCorruptSource):
            names = list(self.layout.fields)
            for i, (name, shard, chunk, first) in enumerate(
                    source.found.take(_CORRUPT_SLOTS)):
                host[_CORRUPT][i] = (names.index(name), shard, chunk, first)
        if pack:
            return writer.message()
        return LocalBatches([{k: torch.from_numpy(v) for k, v in b.items()} if b is not None
                             else {} for b, _ in results], host)

    def _slots(self) -> SlotWriter:
        if self._writer is None or self._writer.key[1] != os.getpid():
            self._writer = SlotWriter(self.token, self.n_slots)
        return self._writer


@dataclass
class LocalBatches:
    """What :meth:`StoreDataset.read` returns without workers: tensors and host counts."""

    batches: list[dict[str, torch.Tensor]]
    host: dict[str, np.ndarray]


def _now() -> float:
    import time

    return time.perf_counter()


def _snapshot(stats: Any) -> tuple[int, ...]:
    if stats is None:
        return (0, 0, 0, 0, 0, 0)
    return (stats.rows, stats.chunks, stats.bytes, stats.requests,
            stats.chunk_cache_hits + stats.row_cache_hits,
            stats.chunk_cache_misses + stats.row_cache_misses)


def _identity(x: Any) -> Any:
    return x


class StoreLoader(DataLoader):
    """A DataLoader of expstore batches; ``stats`` sums what the workers did."""

    def close(self) -> None:
        """Stop persistent worker processes (or the prefetch thread) now (also after a
        worker died)."""
        if self._prefetch is not None:
            self._prefetch.close()
            self._prefetch = None
        it = getattr(self, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            forget_worker_pids(it)
            it._shutdown_workers()
        self._iterator = None
        forget_worker(self.dataset.token)

    def _replan(self, attempts: int = STALE_REPLANS) -> dict[str, torch.Tensor]:
        """A whole batch was overwritten in flight (the writer lapped the guard band, or
        other processes' writers lapped this process's view of their lanes since its last
        refresh): refresh the store, plan again and read it here, in the main process."""
        refresh = getattr(self.plans.sampler, "maybe_refresh", None)
        for _ in range(attempts):
            if refresh is not None:
                refresh(now=True)
            got = self.dataset.read(self.plans.item([self.plans.plan()]), pack=False)
            self.stats.stale_replaced += int(got.host[_STATS_KEY][-1])
            self._quarantine(got.host)
            if not got.host[_ALL_STALE][0]:
                return got.batches[0]
        raise StaleBatchError(f"{attempts} fresh batches in a row were overwritten before "
                              "they could be read; the writer outruns the guard band")

    def __init__(self, dataset: StoreDataset, plans: PlanGroups, device: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(dataset, batch_sampler=plans, collate_fn=_identity, **kwargs)
        self.plans = plans
        self.device = torch.device(device) if device is not None else None
        self.stats = LoaderStats()
        #: the index samplers draw from: corrupt shards the readers report are marked lost
        #: there (``skip_corrupt``); ``None``: not told
        self.index: Any = None
        #: (field number, shard, chunk, lap's first step) quarantined
        self._quarantined: set[tuple[int, int, int, int]] = set()
        #: ``(read lock, depth, pin)``: batches come from a prefetch thread of this process
        #: (``prefetch.py``) instead of DataLoader workers; ``None``: the DataLoader's way
        self.threaded: tuple[Any, int, bool] | None = None
        self._prefetch: Prefetch | None = None

    def _quarantine(self, host: dict[str, np.ndarray]) -> None:
        """Take the corrupt chunks a message reports out of sampling, each once per lap
        (the rows of a later lap in the same slots are sampled again)."""
        names = list(self.dataset.layout.fields)
        for field, shard, chunk, first in host[_CORRUPT].tolist():
            if field < 0:
                break
            if (field, shard, chunk, first) in self._quarantined:
                continue
            self._quarantined.add((field, shard, chunk, first))
            self.stats.corrupt_shards += 1
            if self.index is not None:
                self.stats.corrupt_rows_quarantined += quarantine_lap(
                    self.index, self.dataset.layout, names[field], shard, first, chunk)

    @property
    def plan_sampler(self) -> Any:
        """The expstore sampler drawing this loader's plans (feed priorities to it)."""
        return self.plans.sampler

    def __len__(self) -> int:
        """Batches handed out in all (``num_batches``)."""
        if self.plans.num_batches is None:
            raise TypeError("an endless loader has no len(); pass num_batches")
        return self.plans.num_batches

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        device = self.device if self.device is not None and self.device.type != "cpu" else None
        if self.threaded is not None:
            yield from self._thread_batches(device)
            return
        messages = super().__iter__()
        try:
            yield from self._messages(messages, device)
        except WORKER_ERRORS as e:  # a worker died? (``loading/worker_exit.py``)
            error = worker_death(messages, e)
            if error is None:
                raise
            self.close()
            if error is e:
                raise
            raise error from e

    def _messages(self, messages: Iterator[Any], device: torch.device | None
                  ) -> Iterator[dict[str, torch.Tensor]]:
        for message in messages:
            if isinstance(message, Message):
                self.stats.new_buffers += message.buffer is not None
                batches, host = open_message(message, device)
            else:
                batches, host = message.batches, message.host
                if device is not None:
                    batches = [{k: v.to(device, non_blocking=True) for k, v in b.items()}
                               for b in batches]
            yield from self._hand_out(batches, host, device)

    def _hand_out(self, batches: list[dict[str, torch.Tensor]], host: dict[str, np.ndarray],
                  device: torch.device | None, lock: Any = None,
                  moved: bool = True) -> Iterator[dict[str, torch.Tensor]]:
        """One message's batches to the consumer: its counts added (``batches`` as they
        are handed out), corrupt chunks quarantined, a batch every sample of which was
        stale read again here (both under ``lock``, where a prefetch thread shares the
        index and the reader);
        ``moved``: ``batches`` are on ``device`` already."""
        self.stats.add(dict(zip(_STAT_NAMES[1:], host[_STATS_KEY][1:].tolist())))
        with lock or contextlib.nullcontext():  # (the index the thread plans from)
            self._quarantine(host)
        for batch, all_stale in zip(batches, host[_ALL_STALE].tolist()):
            if all_stale:
                with lock or contextlib.nullcontext():
                    batch = self._replan()
            if device is not None and (all_stale or not moved):
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            self.stats.batches += 1
            yield batch

    def _thread_batches(self, device: torch.device | None
                        ) -> Iterator[dict[str, torch.Tensor]]:
        """:meth:`__iter__` when batches come from a prefetch thread (``threaded``)."""
        lock, depth, pin = self.threaded
        alloc = pinned_alloc(pin)
        if self._prefetch is not None:
            self._prefetch.close()
        self._prefetch = prefetch = Prefetch(locked_reads(
            self.plans, lambda item: self.dataset.read(item, False, alloc), lock), depth)
        try:
            for got in prefetch:
                yield from self._hand_out(got.batches, got.host, device, lock, moved=False)
        finally:
            prefetch.close()
            if self._prefetch is prefetch:
                self._prefetch = None

    def __del__(self) -> None:
        if getattr(self, "_prefetch", None) is not None:
            self._prefetch.close()
        forget_worker(self.dataset.token)


def make_loader(store: Any, sampler: Sampler | None = None, batch_size: int = 32,
                num_workers: int = 2, pin_memory: bool = False, prefetch_factor: int = 2,
                persistent_workers: bool = True, device: str | None = None,
                multiprocessing_context: str | None = None, num_batches: int | None = None,
                guard: int | None = None, spare: int | None = None,
                cache_bytes: int = 256 << 20, timeout: float = 0,
                batches_per_message: int | None = None,
                skip_corrupt: bool = False, threads: bool | None = None,
                hot_bytes: int | None = None, map_bytes: int = 0) -> StoreLoader:
    """A DataLoader streaming ``batch_size`` transitions per batch from ``store``.

    ``sampler`` defaults to a ``UniformSampler``; it stays in this process and is shared:
    call ``sampler.update_priorities`` on it. With workers, ``guard`` rows (default: one
    shard) ahead of the writer are kept clear, and ``spare`` extra samples per batch
    (default ``max(2, batch_size // 16)``) replace rows overwritten between planning and
    reading. Workers read rows not flushed yet from the writers' shared staging where the
    store publishes it (a local store: ``store.publishes_staging``), so nothing is flushed
    for them; elsewhere (object stores) the store is flushed here and only flushed rows are
    sampled. ``cache_bytes``: per-worker decoded-chunk
    cache. ``device="cuda"`` copies batches with ``non_blocking=True`` (use pin_memory).
    ``batches_per_message``: batches a worker reads in one call and sends at once (default
    ``max(1, 512 // batch_size)``, the prefetch thread ``max(1, 1024 // batch_size)``:
    small batches share the per-message cost); priorities
    reach plans at most ``num_workers * prefetch_factor * batches_per_message`` batches
    later (set it to 1 for the tightest bound). Each worker keeps ``prefetch_factor + 2``
    shared slots of one message each (1.8 MB per 32 stacked 84x84 transitions).
    ``skip_corrupt=True`` (or a ``sampler`` made with ``skip_corrupt=True``): a chunk
    that fails its checks does not end training: the
    reading process skips it for the lap it was read in and replaces the samples whose
    reads touch it like stale ones (``loader.stats.corrupt_rows_skipped``), and reports it
    with its batches; this process then marks its rows of that lap lost in ``store.index``
    (RAM only), so ``sampler`` (drawing from ``store``) never draws them again (a later lap
    in the same slots is sampled), logs the chunk once and counts it once
    (``corrupt_shards``, ``corrupt_rows_quarantined``). Reopen the store after ``expstore
    repair`` to sample what the repair kept.

    Which path reads: with ``num_workers > 0`` and ``threads=None`` (the default), a store
    whose fields are all small (no frames: low-dim states, scalars) and whose hot set
    (``open(hot_bytes=...)``) holds every shard, read by a sampler without priorities, in a
    process that writes none of its lanes, is read by one prefetch thread of this process
    (``prefetch.py``: a batch is one C gather without the GIL; ``num_workers *
    prefetch_factor`` items ahead, into pinned tensors with ``pin_memory``); anything else
    (frames, priorities, a store this process writes, or ``threads=False``) by
    ``num_workers`` DataLoader worker processes, each with its own reader and hot set of
    ``hot_bytes`` (default: the store's, 512 MiB: up to that much RAM per worker, taken as
    shards are first read). ``threads=True`` asks for the thread whatever the store holds
    (not for a store this process writes). Either way the loader yields the same batches,
    takes priorities the same way and stops with :meth:`StoreLoader.close`.

    ``map_bytes``: frame shard bytes each worker process maps (``open(map_bytes=...)``;
    default 0: workers read frames with ``pread``). Workers serve stores too large for
    RAM, read cold: pages a process has mapped stay in its RSS and out of reach of
    ``posix_fadvise`` until the kernel reclaims them. The prefetch thread reads through
    this process's reader, mapped as the store was opened. Each worker holds frame
    shards' chunk offsets within the store's ``open(entry_bytes=...)``.
    """
    check_batch(batch_size)
    check_bytes("map_bytes", map_bytes)
    if sampler is None:
        sampler = UniformSampler(store)
    if isinstance(sampler, MixtureSampler):
        raise TypeError("sampler: make_loader reads the plans of one store, and a "
                        "MixtureSampler draws from several; make one loader per component "
                        "sampler and mix their batches, or sample the mixture in this process "
                        "(MixtureSampler.sample)")
    skip_corrupt = bool(skip_corrupt) or bool(getattr(sampler, "skip_corrupt", False))
    if hot_bytes is None:
        hot_bytes = getattr(store, "hot_bytes", 512 << 20)
    if threads and getattr(store, "writers", None):
        raise ValueError("threads=True: this process writes lanes of the store, and a "
                         "prefetch thread would read its index and staging while add() "
                         "changes them; use worker processes (threads=None or False)")
    threaded = num_workers > 0 and (threads if threads is not None
                                    else thread_path_fits(store, sampler))
    staged = None
    if threaded:
        view = ReaderView(guard=guard or 0,
                          spare=max(2, batch_size // 16) if spare is None else spare)
    elif num_workers > 0:
        shard_guard = store.layout.shard_rows if guard is None else guard
        shared = bool(getattr(store, "publishes_staging", False))
        view = ReaderView(committed_only=not shared, guard=shard_guard,
                          spare=max(2, batch_size // 16) if spare is None else spare)
        if shared:
            staged = store.staged_snapshot
        elif store.mode != "r":
            store.flush()
    else:
        view = ReaderView(guard=guard or 0)
    local = (lambda: store.source) if num_workers == 0 or threaded else None
    dataset = StoreDataset(store.url, store.layout, store.storage_options, cache_bytes, local,
                           pack=num_workers > 0 and not threaded, n_slots=prefetch_factor + 2,
                           skip_corrupt=skip_corrupt, hot_bytes=int(hot_bytes),
                           map_bytes=int(map_bytes),
                           entry_bytes=getattr(store, "entry_bytes", None))
    kwargs: dict[str, Any] = dict(num_workers=0 if threaded else num_workers,
                                  pin_memory=pin_memory and not threaded, timeout=timeout)
    if num_workers > 0 and not threaded:
        kwargs.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                      multiprocessing_context=multiprocessing_context)
    group = 1 if num_workers == 0 else (
        batches_per_message if batches_per_message is not None else
        max(1, (1024 if threaded else 512) // batch_size))
    plans = PlanGroups(sampler, batch_size, view, group, num_batches, staged)
    loader = StoreLoader(dataset, plans, device=device, **kwargs)
    if threaded:
        loader.threaded = (store._read_lock, num_workers * prefetch_factor,
                           bool(pin_memory) and torch.cuda.is_available())
    if skip_corrupt:
        loader.index = getattr(sampler, "store", store).index
    return loader
