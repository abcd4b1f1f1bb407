"""Vectorized lookups for the batch read path: no Python per row or per shard.

:class:`ShardTable` mirrors, as flat numpy arrays indexed by shard, what a
:class:`~expstore.storage.read.reader.ShardReader` holds for one field: the version of each
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

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..format import ShardHead
from ..native import copy_rows, native
from .kernel_budget import decoded_slots, worth_filling

#: columns of FdTable.tab (what the C kernel keeps per shard)
TAB_COLS = 6 if native is None else native.TAB_COLS
ECACHE_COLS = 4 if native is None else native.ECACHE_COLS


class ShardTable:
    """Cached shard versions of one field, as arrays over shards (see module docstring).

    ``values_budget``: bytes of decoded values kept for multi-row-chunk fields (this
    field's share of the store's hot set, ``open(hot_bytes=...)``): shards are admitted as
    they are first read while it has room, never evicted; rows of shards left out are read
    by the kernel through ``fds`` (only the blosc blocks holding them decoded), else the
    general path. ``fds``: the field's descriptors for the kernel (``None``: no
    kernel); frame fields (one row per chunk) are read only through them.
    """

    def __init__(self, n_shards: int, shard_rows: int, chunk_rows: int, shape: tuple,
                 dtype: np.dtype, values_budget: int, fds: FdTable | None = None) -> None:
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
        self.fds = fds
        self.values = np.zeros((0, shard_rows, *self.shape), self.dtype)
        per_slot = shard_rows * self.dtype.itemsize * int(np.prod(self.shape))
        self.max_slots = 0 if chunk_rows == 1 else decoded_slots(n_shards, per_slot,
                                                                  values_budget)
        self.opened = 0  # versions bound so far (shard opens of this field)

    @property
    def per_row(self) -> bool:
        """Whether each inner chunk holds one row (its bytes are read and decoded per row)."""
        return self.chunk_rows == 1

    def bind(self, shard: int, fd: int, head: ShardHead, trusted: int,
             values: np.ndarray | None = None) -> None:
        """Record the version of ``shard`` just cached (``values``: its decoded rows).
        Frame fields keep nothing here: the kernel opens their shards itself (``fds``)."""
        self.unbind(shard)
        self.opened += 1
        if values is None or not self.max_slots:
            return  # rows of this shard: the kernel (fds) or the general path
        s = self._take_slot(shard)
        if s < 0:
            return  # the budget is full: this shard's rows are read, not held
        self.first[shard], self.n_rows[shard] = head.first_step, head.n_rows
        self.trusted[shard], self.fd[shard] = trusted, fd
        self.values[s] = values

    @property
    def fills(self) -> bool:
        """Whether the kernel decodes missed shards straight into value slots: chunks of
        more than one row, and room enough (``kernel_budget.worth_filling``: vectors one
        shard, scalars half of them; with less, the budget holds compressed chunks:
        ``kernel_shares``). A shard of several chunks is filled whole, all its chunks read
        the first time one of its rows is."""
        return self.chunk_rows > 1 and worth_filling(
            self.max_slots, len(self.slot), int(np.prod(self.shape, dtype=np.int64)))

    @property
    def full(self) -> bool:
        """Whether every value slot the budget allows is taken: no shard is admitted any
        more (rows of shards without a slot are read alone; a shard holding one is still
        refilled when a lap rewrote it)."""
        return len(self.owner) >= self.max_slots and not (self.owner < 0).any()

    def claim(self, shards: np.ndarray) -> np.ndarray:
        """Value slots for ``shards`` (distinct), to be filled by the kernel: their own slot
        if they hold one, else free ones while the budget has room; -1 where none is left
        (admission, not eviction: a slot once given to a shard stays its own, refilled when
        a lap rewrites the shard, so a store past the budget never churns; rows of shards
        without a slot are decoded alone, straight into the batch). The shards are not
        ready until :meth:`commit`."""
        s = self.slot[shards]
        need = np.flatnonzero(s < 0)
        if len(need):
            free = np.flatnonzero(self.owner < 0)
            if len(free) < len(need) and len(self.owner) < self.max_slots:
                self._grow(min(self.max_slots,
                               max(8, 2 * len(self.owner), len(self.owner) + len(need))))
                free = np.flatnonzero(self.owner < 0)
            free = free[: len(need)]
            got = need[: len(free)]
            self.owner[free] = shards[got]
            self.slot[shards[got]] = free
            s[got] = free
        self.first[shards] = -1
        return s

    def commit(self, shards: np.ndarray, fds: FdTable) -> None:
        """Shards whose chunk the kernel decoded into their claimed slot: ready, as the
        version ``fds`` holds for them."""
        e = fds.tab[shards]
        self.first[shards] = e[:, fds.FIRST]
        self.n_rows[shards] = e[:, fds.NROWS]
        self.trusted[shards] = e[:, fds.TRUSTED]
        self.fd[shards] = -1  # the descriptor is the kernel's

    def release(self, shards: np.ndarray) -> None:
        """Free the slots claimed for ``shards`` (the kernel did not fill them)."""
        s = self.slot[shards]
        held = s >= 0
        self.owner[s[held]] = -1
        self.slot[shards] = -1
        self.first[shards] = -1

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
        if self.fds is not None:
            self.fds.clear()

    def _take_slot(self, shard: int) -> int:
        """A free value slot for ``shard`` (-1: the budget is full; nothing is evicted)."""
        free = np.flatnonzero(self.owner < 0)
        if len(free):
            s = int(free[0])
        elif len(self.owner) < self.max_slots:
            s = len(self.owner)
            self._grow(min(self.max_slots, max(8, 2 * len(self.owner))))
        else:
            return -1
        self.owner[s] = shard
        self.slot[shard] = s
        return s

    def _grow(self, n: int) -> None:
        old = len(self.owner)
        self.owner = np.concatenate([self.owner, np.full(n - old, -1, np.int64)])
        grown = np.zeros((n, *self.values.shape[1:]), self.dtype)
        grown[:old] = self.values
        self.values = grown

    def ready(self, shards: np.ndarray, slots: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Rows the cached versions hold and are trusted for (step < trusted count); for
        frame fields, the versions the kernel holds open."""
        if self.per_row:
            if self.fds is None:
                return np.zeros(len(shards), bool)
            return self.fds.ready(shards, slots, steps)
        first = self.first[shards]
        ok = (first >= 0) & (first + slots == steps) & (slots < self.n_rows[shards])
        ok &= steps < self.trusted[shards]
        ok &= self.slot[shards] >= 0
        return ok



class FdTable:
    """Shard versions of one field held open for the C kernel (see module docstring).

    ``tab`` (int64, ``(n_shards, TAB_COLS)``) is written by ``_kernels.read_rows``: per
    shard its descriptor (-1: none), the header's first step and rows, and the committed
    count the version is trusted for. At most ``max_fds`` descriptors are open; beyond
    that the kernel closes the oldest opened. ``held_bytes``: an arena of compressed
    chunks (fields of one multi-row chunk per shard), see ``shard_reads.h``. Local stores
    only. ``known``: the reader's committed counts per lane (changed in place by the
    reader; a shard the kernel opens is trusted for its lane's count), ``row_bytes``: bytes
    of one of the field's rows. All of it is handed to the kernel once, as ``state`` (a
    ``ReadState``); each :meth:`read` passes only the batch.
    """

    FD, FIRST, NROWS, TRUSTED, RINGPOS, GEN = range(6)
    #: columns of ``held_tab``: arena position (-1: none), bytes, first step, rows, trusted
    H_POS, H_NB, H_FIRST, H_NROWS, H_TRUSTED = range(5)

    def __init__(self, root: str, key_of: Callable[[int], str], n_shards: int, n_chunks: int,
                 chunk_rows: int, max_fds: int, known: np.ndarray, shards_per_lane: int,
                 checksum: bool, row_bytes: int, max_entries: int = 1 << 19,
                 held_bytes: int = 0) -> None:
        probe = key_of(0)
        head, _, tail = probe.partition("/c/0")
        self.prefix = os.fsencode(os.path.join(root, head + "/c/"))
        self.suffix = os.fsencode(tail)
        self.n_chunks = n_chunks
        self.chunk_rows = chunk_rows
        self.tab = np.full((n_shards, TAB_COLS), -1, np.int64)
        self.tab[:, [self.FIRST, self.NROWS, self.TRUSTED, self.GEN]] = 0
        self.ring = np.full(max(1, min(max_fds, n_shards)), -1, np.int64)
        self.state = np.zeros(3, np.int64)  # ring positions used, next to reuse, opens
        #: index entries read (direct-mapped by chunk; 32 B each), valid only with the
        #: descriptor they were read through: a store of up to ``max_entries`` chunks
        #: costs one read per chunk, not two
        self.entries = np.full((max(1, min(max_entries, n_shards * n_chunks)), ECACHE_COLS),
                               -1, np.int64)
        self.opened = 0  # shard versions opened so far
        #: ``held_bytes`` > 0 (one multi-row chunk per shard): compressed chunks read are
        #: kept in this arena, oldest overwritten first, and later rows of the same
        #: version decoded from it without a read (pages taken as it fills)
        self.held = np.zeros(held_bytes, np.uint8) if held_bytes > 0 else None
        self.held_tab = np.full((n_shards if held_bytes > 0 else 0, 5), -1, np.int64)
        self.held_state = np.zeros(1, np.int64)  # bytes written to the arena so far
        held = (self.held, self.held_tab, self.held_state) if self.held is not None else ()
        self.state_of_reads = native.ReadState(
            self.prefix, self.suffix, n_chunks, chunk_rows, shards_per_lane, row_bytes,
            checksum, known, self.tab, self.ring, self.state, self.entries, *held)

    def ready(self, shards: np.ndarray, slots: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Rows an open version holds and is trusted for."""
        e = self.tab[shards]
        return ((e[:, self.FD] >= 0) & (e[:, self.FIRST] + slots == steps)
                & (slots < e[:, self.NROWS]) & (steps < e[:, self.TRUSTED]))

    def read(self, shards: np.ndarray, slots: np.ndarray, steps: np.ndarray, dst: np.ndarray,
             flat: np.ndarray, stats: Any, chunks: np.ndarray | None = None,
             chunk_dst: np.ndarray | None = None) -> tuple[np.ndarray, bool]:
        """Rows into rows ``dst`` of ``flat`` (uint8, ``row_bytes`` per row) with one kernel call,
        opening shards as needed: a mask of rows delivered, and whether the kernel may be
        used again for this field (not when it met a codec it does not decode).
        ``chunks``/``chunk_dst``: multi-row chunks are decoded at byte ``chunk_dst[i]`` of
        ``chunks`` (-1: scratch), where the caller keeps them."""
        ok = np.zeros(len(shards), np.uint8)
        extra = (() if chunks is None else
                 (chunks, np.ascontiguousarray(chunk_dst, np.int64)))
        status, nbytes, opened, reads = native.read_rows(
            self.state_of_reads, np.ascontiguousarray(shards, np.int64),
            np.ascontiguousarray(slots, np.int64), np.ascontiguousarray(steps, np.int64),
            np.ascontiguousarray(dst, np.int64), flat, ok, *extra)
        done = ok.view(bool)
        n = int(done.sum())
        self.opened += opened
        stats.requests += reads + opened  # index entries and chunks read, headers
        stats.chunks += n
        stats.bytes += int(nbytes)
        return done, status != native.STATUS_UNSUPPORTED

    def forget(self, shard: int) -> None:
        """Close the version of ``shard`` held (e.g. this process rewrote it)."""
        if len(self.held_tab):
            self.held_tab[shard, self.H_POS] = -1
        fd = int(self.tab[shard, self.FD])
        if fd >= 0:
            self.tab[shard, self.FD] = -1
            os.close(fd)

    def clear(self) -> None:
        """Close every descriptor held and drop the chunks held."""
        for shard in np.flatnonzero(self.tab[:, self.FD] >= 0).tolist():
            self.forget(shard)
        self.held_tab[:, self.H_POS] = -1

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

    def place(self, rows: np.ndarray, steps: np.ndarray, servable: np.ndarray,
              cacheable: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Where each of a read's rows (distinct (row, step) pairs) is to be found in
        ``data``: ``(pos, hit, own)``. ``hit``: cached (``servable`` rows only); ``own``:
        rows to decode into their own slot (``cacheable`` rows, default ``servable``),
        which no other row of the read holds. The rest go to scratch rows. ``None``: more
        rows need scratch than there is.

        Slots of ``own`` rows are emptied here: they are refilled by :meth:`keep` once
        their rows are decoded.
        """
        if native is not None:
            pos, hit, own = (np.empty(len(rows), np.int64), np.empty(len(rows), bool),
                             np.empty(len(rows), bool))
            placed = native.place_rows(
                np.ascontiguousarray(rows, np.int64), np.ascontiguousarray(steps, np.int64),
                np.ascontiguousarray(servable, bool),
                np.ascontiguousarray(servable if cacheable is None else cacheable, bool),
                self.row, self.step, self.n, self.scratch, pos, hit, own)
            return (pos, hit, own) if placed else None
        at = rows % self.n
        hit = (self.row[at] == rows) & (self.step[at] == steps) & servable
        own = (servable if cacheable is None else cacheable) & ~hit
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


@dataclass
class KernelRead:
    """What a kernel read of one field needs besides the rows and the field's
    :class:`FdTable` (which holds the rest, once): the reader's counters (a
    ``ReadStats``)."""

    stats: Any


def serve(table: ShardTable, cache: RowCache | None, kernel: bool, ctx: KernelRead,
          rows: np.ndarray, steps: np.ndarray, shards: np.ndarray, slots: np.ndarray,
          ready: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, bool]:
    """Serve rows into ``out``: decoded values ``table`` holds (``ready`` rows), frames
    from ``cache`` (``ready`` rows: their version is still the one held), and the rest
    with one ``read_rows`` kernel call, which opens shards as it needs.

    Returns the mask of rows served (the caller reads the rest the general way) and
    whether the kernel may be used again for this field.
    """
    stats = ctx.stats
    flat = out.reshape(len(out), -1).view(np.uint8)
    if not table.per_row:
        done = ready
        n = int(ready.sum())
        if n:
            out[ready] = table.values[table.slot[shards[ready]], slots[ready]]
        stats.chunk_cache_hits += n
    else:
        done = np.zeros(len(rows), bool)
        if cache:  # only rows the current version still holds (else: stale, as uncached)
            done = cache.lookup(rows, steps, flat) & ready
            hits = int(done.sum())
            stats.row_cache_hits += hits
            stats.row_cache_misses += len(rows) - hits
    use = kernel and table.fds is not None
    todo = np.flatnonzero(~done) if use else np.zeros(0, np.int64)
    if len(todo):
        if table.per_row or not table.fills or (table.full and
                                                (table.slot[shards[todo]] < 0).all()):
            got, kernel = table.fds.read(shards[todo], slots[todo], steps[todo], todo, flat,
                                         stats)
        else:
            got, kernel = _read_filling(table, ctx, shards[todo], slots[todo], steps[todo],
                                        todo, flat)
        served = todo[got]
        done = done.copy() if done is ready else done
        done[served] = True
        if cache and table.per_row:
            cache.insert(rows[served], steps[served], flat[served])
    stats.rows += int(done.sum())
    return done, kernel


def _read_filling(table: ShardTable, ctx: KernelRead, shards: np.ndarray, slots: np.ndarray,
                  steps: np.ndarray, dst: np.ndarray, flat: np.ndarray
                  ) -> tuple[np.ndarray, bool]:
    """Rows of a multi-row-chunk field into ``flat`` by the kernel, each shard's chunks
    decoded into a value slot of ``table`` and kept there (see :meth:`FdTable.read`)."""
    uniq, inv = np.unique(shards, return_inverse=True)
    claimed = table.claim(uniq)
    held = claimed >= 0
    if not held.any():  # the hot set is full: rows decoded alone
        return table.fds.read(shards, slots, steps, dst, flat, ctx.stats)
    per_slot = table.values[0].nbytes
    chunks = table.values.reshape(len(table.values), -1).view(np.uint8)
    if table.chunk_rows < table.shard_rows:
        return _fill_chunks(table, ctx, uniq, inv, claimed, shards, slots, steps, dst, flat)
    got, kernel = table.fds.read(shards, slots, steps, dst, flat, ctx.stats, chunks,
                                 np.where(held, claimed * per_slot, -1)[inv])
    failed = np.zeros(len(uniq), bool)
    failed[inv[~got]] = True  # a row of the shard failed: its slot may hold anything
    table.commit(uniq[held & ~failed], table.fds)
    table.release(uniq[held & failed])
    return got, kernel


def _fill_chunks(table: ShardTable, ctx: KernelRead, uniq: np.ndarray, inv: np.ndarray,
                 claimed: np.ndarray, shards: np.ndarray, slots: np.ndarray,
                 steps: np.ndarray, dst: np.ndarray, flat: np.ndarray
                 ) -> tuple[np.ndarray, bool]:
    """:func:`_read_filling` for shards of several chunks. The rows are read alone first
    (that call opens the versions they need); then every chunk of each claimed shard that
    holds rows of the version now open (its trusted rows) is decoded into the shard's slot
    by a second call, which opens nothing, so a slot never mixes two versions (a shard
    grows chunk by chunk: a chunk read from an older version may lack rows)."""
    got, kernel = table.fds.read(shards, slots, steps, dst, flat, ctx.stats)
    fds = table.fds
    fill = np.flatnonzero((claimed >= 0) & (fds.tab[uniq, fds.FD] >= 0))
    fill = fill[~np.isin(fill, inv[~got])]  # (a row of the shard failed: not this time)
    e = fds.tab[uniq[fill]].copy()
    R, S = table.chunk_rows, table.shard_rows
    rows = np.clip(np.minimum(e[:, fds.NROWS], e[:, fds.TRUSTED] - e[:, fds.FIRST]), 0, S)
    n_chunks = -(-rows // R)
    if kernel and n_chunks.sum():
        owner = np.repeat(np.arange(len(fill)), n_chunks)
        c = np.arange(len(owner)) - np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
        per_slot = table.values[0].nbytes
        scratch = np.empty((len(owner), flat.shape[1]), np.uint8)
        ok, kernel = fds.read(
            uniq[fill][owner], c * R, e[owner, fds.FIRST] + c * R,
            np.arange(len(owner), dtype=np.int64), scratch, ctx.stats,
            table.values.reshape(len(table.values), -1).view(np.uint8),
            claimed[fill][owner] * per_slot + c * (per_slot // S * R))
        bad = np.zeros(len(fill), bool)
        bad[owner[~ok]] = True
        bad |= fds.tab[uniq[fill], fds.GEN] != e[:, fds.GEN]  # (reopened: not this time)
        done = fill[~bad]
        kept = uniq[done]
        table.first[kept] = e[~bad, fds.FIRST]
        table.n_rows[kept] = rows[~bad]
        table.trusted[kept] = e[~bad, fds.TRUSTED]
        table.fd[kept] = -1
    else:
        done = fill[:0]
    rest = np.setdiff1d(np.flatnonzero(claimed >= 0), done)
    table.release(uniq[rest])
    return got, kernel


def serve_held(table: ShardTable, cache: RowCache, ctx: KernelRead, rows: np.ndarray,
               steps: np.ndarray, shards: np.ndarray, slots: np.ndarray, ready: np.ndarray,
               wanted: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """Like :func:`serve` for frames, without copying them out: rows stay in (or are
    decoded straight into) ``cache.data``. ``wanted``: rows to read from storage (``None``:
    all). Returns ``(pos, done, kernel)``: row ``i`` is ``cache.data[pos[i]]`` once
    ``done[i]``; the caller fills the rest (general path) into those same rows. ``None``
    where the cache's scratch cannot take this read.
    """
    want = np.ones(len(rows), bool) if wanted is None else wanted
    placed = cache.place(rows, steps, ready & want, want)
    if placed is None:
        return None
    pos, done, own = placed
    stats = ctx.stats
    hits = int(done.sum())
    stats.row_cache_hits += hits
    stats.row_cache_misses += len(rows) - hits
    todo = np.flatnonzero(want & ~done)
    kernel = True
    if len(todo):
        got, kernel = table.fds.read(shards[todo], slots[todo], steps[todo], pos[todo],
                                     cache.data, stats)
        served = todo[got]
        done[served] = True
        mine = served[own[served]]
        cache.keep(rows[mine], steps[mine])
    stats.rows += int(done.sum())
    return pos, done, kernel
