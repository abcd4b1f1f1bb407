"""Vectorized lookups for the batch read path: no Python per row or per shard.

:class:`ShardTable` mirrors, as flat numpy arrays indexed by shard, what a
:class:`~expstore.storage.reader.ShardReader` holds for one field: the version of each
cached shard (first step, rows, the committed count it is trusted for, its file
descriptor), and per shard either the byte range of every inner chunk (fields stored one
row per chunk: frames) or the decoded values of the whole shard (fields stored many rows
per chunk: scalars, small vectors). Checking which rows of a batch a cached version
holds, and finding their bytes or values, is then a handful of array operations.

:class:`RowCache` keeps decoded rows of one field, direct-mapped by row: a lookup is an
array comparison, an insert an array assignment. Entries are keyed by (row, lane step),
and only rows read through a trusted version are inserted, so a hit is always the data
the writer committed for that step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import StoreCorruptError
from .kernels import copy_rows, native
from .shard import EMPTY, ShardHead, parse_head


class ShardTable:
    """Cached shard versions of one field, as arrays over shards (see module docstring).

    ``values_budget``: bytes of decoded values kept for multi-row-chunk fields; beyond it
    a random slot is evicted (its rows then take the general path until re-opened).
    """

    def __init__(self, n_shards: int, shard_rows: int, chunk_rows: int, shape: tuple,
                 dtype: np.dtype, values_budget: int) -> None:
        self.shard_rows = shard_rows
        self.chunk_rows = chunk_rows
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.first = np.full(n_shards, -1, np.int64)  # first lane step, -1: none cached
        self.n_rows = np.zeros(n_shards, np.int64)
        self.trusted = np.zeros(n_shards, np.int64)  # serves steps below this count
        self.fd = np.full(n_shards, -1, np.int32)
        self.slot = np.full(n_shards, -1, np.int64)  # row of the pool arrays, -1: none
        self.owner = np.zeros(0, np.int64)  # shard of each slot, -1: free
        n_chunks = shard_rows // chunk_rows
        if chunk_rows == 1:
            self.starts = np.zeros((0, n_chunks), np.int64)
            self.sizes = np.zeros((0, n_chunks), np.int64)
            self.max_slots = n_shards
        else:
            self.values = np.zeros((0, shard_rows, *self.shape), self.dtype)
            per_slot = max(1, shard_rows * self.dtype.itemsize * int(np.prod(self.shape)))
            self.max_slots = int(min(n_shards, values_budget // per_slot))  # 0: none kept
        self._rng = np.random.default_rng(0)
        self.opened = 0  # versions bound so far (shard opens of this field)

    @property
    def per_row(self) -> bool:
        """Whether each inner chunk holds one row (its bytes are read and decoded per row)."""
        return self.chunk_rows == 1

    def bind(self, shard: int, fd: int, head: ShardHead, trusted: int,
             values: np.ndarray | None = None) -> None:
        """Record the version of ``shard`` just cached (``values``: its decoded rows)."""
        self.unbind(shard)
        self.opened += 1
        if not self.per_row and (values is None or not self.max_slots):
            return  # rows of this shard take the general path (chunk cache)
        s = self._take_slot(shard)
        self.first[shard], self.n_rows[shard] = head.first_step, head.n_rows
        self.trusted[shard], self.fd[shard] = trusted, fd
        if self.per_row:
            empty = head.offsets == EMPTY
            self.starts[s] = np.where(empty, 0, head.offsets).astype(np.int64)
            self.sizes[s] = np.where(empty, -1, head.nbytes).astype(np.int64)
        else:
            self.values[s] = values

    def unbind(self, shard: int) -> None:
        s = int(self.slot[shard])
        if s >= 0:
            self.owner[s] = -1
        self.slot[shard] = -1
        self.first[shard] = -1
        self.fd[shard] = -1

    def clear(self) -> None:
        for shard in np.flatnonzero(self.slot >= 0).tolist():
            self.unbind(shard)

    def _take_slot(self, shard: int) -> int:
        free = np.flatnonzero(self.owner < 0)
        if len(free):
            s = int(free[0])
        elif len(self.owner) < self.max_slots:
            s = len(self.owner)
            self._grow(min(self.max_slots, max(8, 2 * len(self.owner))))
        else:  # full: evict a random slot (no per-access bookkeeping needed)
            s = int(self._rng.integers(len(self.owner)))
            self.unbind(int(self.owner[s]))
        self.owner[s] = shard
        self.slot[shard] = s
        return s

    def _grow(self, n: int) -> None:
        old = len(self.owner)
        self.owner = np.concatenate([self.owner, np.full(n - old, -1, np.int64)])
        if self.per_row:
            pad = ((0, n - old), (0, 0))
            self.starts = np.pad(self.starts, pad)
            self.sizes = np.pad(self.sizes, pad, constant_values=-1)
        else:
            grown = np.zeros((n, *self.values.shape[1:]), self.dtype)
            grown[:old] = self.values
            self.values = grown

    def ready(self, shards: np.ndarray, slots: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Rows the cached versions hold and are trusted for (step < trusted count)."""
        first = self.first[shards]
        ok = (first >= 0) & (first + slots == steps) & (slots < self.n_rows[shards])
        ok &= steps < self.trusted[shards]
        ok &= self.slot[shards] >= 0
        return ok


class RowCache:
    """Decoded rows of one field, direct-mapped by row, at most ``budget`` bytes.

    A sixteenth of the rows is *scratch*: rows a read needs but cannot place in their own
    slot (another row of the same read holds it, or they come from the general path).
    """

    def __init__(self, row_bytes: int, budget: int) -> None:
        total = max(0, budget // max(1, row_bytes))
        self.scratch = total // 16
        self.n = total - self.scratch  # direct-mapped slots
        self.row = np.full(self.n, -1, np.int64)
        self.step = np.full(self.n, -1, np.int64)
        self.data = np.zeros((total, row_bytes), np.uint8) if self.n else None

    def __bool__(self) -> bool:
        return self.n > 0

    def lookup(self, rows: np.ndarray, steps: np.ndarray, flat_out: np.ndarray) -> np.ndarray:
        """Copy cached rows into ``flat_out`` (``(len(rows), row_bytes)`` uint8); hit mask."""
        at = rows % self.n
        hit = (self.row[at] == rows) & (self.step[at] == steps)
        if hit.any():
            copy_rows(self.data, at[hit], flat_out, np.flatnonzero(hit))
        return hit

    def insert(self, rows: np.ndarray, steps: np.ndarray, flat_rows: np.ndarray) -> None:
        """Keep decoded ``flat_rows`` (one per row) for (row, step)."""
        if not len(rows):
            return
        at, first = np.unique(rows % self.n, return_index=True)
        self.row[at] = rows[first]
        self.step[at] = steps[first]
        copy_rows(flat_rows, first, self.data, at)

    def place(self, rows: np.ndarray, steps: np.ndarray, servable: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Where each of a read's rows (distinct (row, step) pairs) is to be found in
        ``data``: ``(pos, hit, own)``. ``hit``: cached (``servable`` rows only); ``own``:
        rows to decode into their own slot, which no other row of the read holds. The rest
        go to scratch rows. ``None``: more rows need scratch than there is.

        Slots of ``own`` rows are emptied here: they are refilled by :meth:`keep` once
        their rows are decoded.
        """
        at = rows % self.n
        hit = (self.row[at] == rows) & (self.step[at] == steps) & servable
        own = servable & ~hit
        cand = np.flatnonzero(hit | own)
        order = np.lexsort((~hit[cand], at[cand]))  # by slot, a hit first
        by_slot = at[cand[order]]
        loses = np.zeros(len(cand), bool)
        loses[order[1:][by_slot[1:] == by_slot[:-1]]] = True  # a slot taken earlier
        own[cand[loses]] = False
        pos = at.copy()
        spill = np.flatnonzero(~(hit | own))
        if len(spill) > self.scratch:
            return None
        pos[spill] = self.n + np.arange(len(spill))
        self.row[at[own]] = -1
        return pos, hit, own

    def keep(self, rows: np.ndarray, steps: np.ndarray) -> None:
        """Record that ``rows`` (each placed ``own``) now hold the data of ``steps``."""
        at = rows % self.n
        self.row[at] = rows
        self.step[at] = steps

    def forget(self, rows: np.ndarray, steps: np.ndarray) -> None:
        at = rows % self.n
        drop = (self.row[at] == rows) & (self.step[at] == steps)
        self.row[at[drop]] = -1

    def clear(self) -> None:
        self.row[:] = -1


def decode_ready(table: ShardTable, checksum: bool, todo: np.ndarray, shards: np.ndarray,
                 slots: np.ndarray, dst: np.ndarray, flat: np.ndarray, stats: Any
                 ) -> tuple[np.ndarray, bool]:
    """Decode rows ``todo`` (positions in a read, each of a cached trusted version) into
    rows ``dst`` of ``flat`` with one kernel call: the positions decoded, and whether the
    kernel may be used again for this field (not when it met a codec it does not decode).
    A row whose chunk is missing, or that fails to read or decode, is left to the caller.
    """
    slot = table.slot[shards[todo]]
    sizes = table.sizes[slot, slots[todo]]
    keep = sizes >= 0  # a missing chunk: the general path reports it
    todo, slot, sizes, dst = todo[keep], slot[keep], sizes[keep], dst[keep]
    starts = table.starts[slot, slots[todo]]
    status, bad, nbytes = native.decode_pread(table.fd[shards[todo]], starts, sizes, dst,
                                              flat, flat.shape[1], checksum)
    served = todo if status == native.STATUS_OK else todo[:bad]
    stats.requests += len(served)
    stats.chunks += len(served)
    stats.bytes += int(nbytes)
    return served, status != native.STATUS_UNSUPPORTED


def serve(table: ShardTable, cache: RowCache | None, kernel: bool, checksum: bool,
          rows: np.ndarray, steps: np.ndarray, shards: np.ndarray, slots: np.ndarray,
          ready: np.ndarray, out: np.ndarray, stats: Any) -> tuple[np.ndarray, bool]:
    """Serve the ``ready`` rows into ``out``: decoded values held by ``table``, or frames
    from ``cache`` and, for the rest, one ``decode_pread`` kernel call.

    Returns the mask of rows served (the caller reads the rest the general way) and
    whether the kernel may be used again for this field. Counts into ``stats`` (a
    ``ReadStats``).
    """
    if not table.per_row:
        n = int(ready.sum())
        if n:
            out[ready] = table.values[table.slot[shards[ready]], slots[ready]]
        stats.chunk_cache_hits += n
        stats.rows += n
        return ready, kernel
    flat = out.reshape(len(out), -1).view(np.uint8)
    done = np.zeros(len(rows), bool)
    if cache:  # only rows the current version still holds (else: stale, as uncached)
        done = cache.lookup(rows, steps, flat) & ready
        hits = int(done.sum())
        stats.row_cache_hits += hits
        stats.row_cache_misses += len(rows) - hits
    todo = np.flatnonzero(ready & ~done) if kernel else np.zeros(0, np.int64)
    if len(todo):
        served, kernel = decode_ready(table, checksum, todo, shards, slots, todo, flat, stats)
        done[served] = True
        if cache:
            cache.insert(rows[served], steps[served], flat[served])
    stats.rows += int(done.sum())
    return done, kernel


def serve_held(table: ShardTable, cache: RowCache, checksum: bool, rows: np.ndarray,
               steps: np.ndarray, shards: np.ndarray, slots: np.ndarray, ready: np.ndarray,
               stats: Any) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """Like :func:`serve` for frames, without copying them out: rows stay in (or are
    decoded straight into) ``cache.data``. Returns ``(pos, done, kernel)``: row ``i``
    is ``cache.data[pos[i]]`` once ``done[i]``; the caller fills the rest (general path)
    into those same rows. ``None`` where the cache's scratch cannot take this read.
    """
    placed = cache.place(rows, steps, ready)
    if placed is None:
        return None
    pos, done, own = placed
    hits = int(done.sum())
    stats.row_cache_hits += hits
    stats.row_cache_misses += len(rows) - hits
    todo = np.flatnonzero(ready & ~done)
    kernel = True
    if len(todo):
        served, kernel = decode_ready(table, checksum, todo, shards, slots, pos[todo],
                                      cache.data, stats)
        done[served] = True
        mine = served[own[served]]
        cache.keep(rows[mine], steps[mine])
    stats.rows += int(done.sum())
    return pos, done, kernel


def parse_head_retrying(backend: Any, key: str, h: Any, raw: bytes, size: int,
                        n_chunks: int, stats: Any) -> tuple[Any, bytes, ShardHead]:
    """Parse the head of shard object ``key`` read through handle ``h``. On local disk a
    head that fails its checks is read again through a new handle, a few times: a partial
    shard is rewritten in place while it fills, and a read racing that can see a mix of
    two versions, which the crc32c checks refuse. Returns the handle, bytes and head
    used; closes ``h`` when it raises."""
    where = f"{backend.url}/{key}"
    tries = 4 if backend.is_local else 1
    for attempt in range(tries):
        try:
            return h, raw, parse_head(raw, n_chunks, where)
        except StoreCorruptError:
            backend.close_object(h)
            if attempt == tries - 1:
                raise
        got = backend.open_object(key)
        if got is None:
            raise StoreCorruptError(f"{where}: shard vanished while being read")
        h = got
        raw = backend.read_ranges([(h, 0, size)], missing_ok=True)[0]
        stats.requests += 1
        if raw is None:
            backend.close_object(h)
            raise StoreCorruptError(f"{where}: shard vanished while being read")
    raise AssertionError("unreachable")
