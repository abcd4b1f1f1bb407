"""The row cache of the batch read path and the functions that serve a batch's rows.

:class:`RowCache` keeps decoded rows of one field, direct-mapped by row: a lookup is an
array comparison, an insert an array assignment. Entries are keyed by (row, lane step),
and only rows read through a trusted version are inserted, so a hit is always the data
the writer committed for that step.

:func:`serve` and :func:`serve_held` serve a field's rows of a batch from the decoded
values a :class:`~.shard_table.ShardTable` holds, the row cache, and one call of the C
kernel through the field's :class:`~.fd_table.FdTable`. Those two classes (and
``TAB_COLS``, ``ECACHE_COLS``) are importable from here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..native import copy_rows, native
from .fd_table import ECACHE_COLS, TAB_COLS, FdTable
from .shard_table import ShardTable

__all__ = ["ECACHE_COLS", "TAB_COLS", "FdTable", "KernelRead", "RowCache", "ShardTable",
           "serve", "serve_held", "serve_undecoded"]


#: bytes of a row cache slot's key: the row and the lane step it holds (int64 each)
SLOT_KEY_BYTES = 16

#: a frame cache whose held rows serve fewer of the lookups that find their slot taken is
#: passed by (reads go as without one): below ~0.6 its misses cost more than its hits save
#: (small frames, warm page cache: at a 0.53 hit rate a cached 10M-row store sampled 11%
#: slower than with no cache, at 0.2 0.94-1.35x its time, at 1.0 3x faster; ``benchmarks/
#: RESULTS.md``, "Issue 26: read path, status")
BYPASS_BELOW = 0.6
#: the same line for rows of at least :data:`FRAME_ROW_BYTES` (image frames): a hit saves
#: a frame's decode (84x84 Atari frames: ~1.3-7 µs). At a 0.35 hit rate such a cache made
#: `sample` 1-22% faster (Pong, MsPacman; twelve A/Bs), at 0.09 from 16% faster to 26% slower
FRAME_BYPASS_BELOW = 0.2
#: rows of at least this many bytes are judged by :data:`FRAME_BYPASS_BELOW`
FRAME_ROW_BYTES = 1024
#: a passed-by cache is still used by one read in this many, to judge it again
PROBE_EVERY = 64
#: an engaged cache is judged on one read in this many (the judging costs a gather)
JUDGE_EVERY = 8
#: lookups (that found their slot taken) the judged hit rate is taken over
JUDGE_ROWS = 4096


#: scratch bytes one fill of a scalar held as codes decodes its shards into before coding
#: them (a batch of 256 rows of a 1B-row store's int64 action: up to 256 shards of 4 MiB)
FILL_SCRATCH_BYTES = 64 << 20


class RowCache:
    """Decoded rows of one field, direct-mapped by row, at most ``budget`` bytes: each
    slot takes its row's bytes and :data:`SLOT_KEY_BYTES` for the (row, step) it holds
    (for 16-byte rows, half of the budget), and no more slots than the store has ``rows``
    (the keys' and the rows' pages are taken only as slots are used).

    A sixteenth of the rows is *scratch*: rows a read needs but cannot place in their own
    slot (another row of the same read holds it, or they come from the general path).

    The cache judges itself: ``hit_rate`` is the share of lookups served among those that
    found their slot taken (of the last ~:data:`JUDGE_ROWS`). An empty slot is a cache
    still filling, so this is the hit rate it will have once full, from its first reads:
    ~1 where it has a slot per row, slots / rows for uniform draws from a larger store. Below
    ``line`` (:data:`BYPASS_BELOW`; :data:`FRAME_BYPASS_BELOW` for rows of at least
    :data:`FRAME_ROW_BYTES`) it is not :meth:`engaged`: readers pass it by (and call
    :meth:`skip`) except on one read in :data:`PROBE_EVERY`, which judges it again.
    """

    def __init__(self, row_bytes: int, budget: int, rows: int | None = None) -> None:
        total = max(0, budget // (max(1, row_bytes) + SLOT_KEY_BYTES))
        self.scratch = total // 16
        self.n = total - self.scratch  # direct-mapped slots
        if rows is not None:
            self.n = min(self.n, rows)
        #: per slot, the row it holds plus one (0: empty) and that row's lane step: zeroed
        #: pages from the system, paid for as slots are first used (keys of -1 written at
        #: open took 0.43 s and 126 MB at 100M rows, for a cache such a store passes by)
        self.tag = np.zeros(self.n, np.int64)
        self.step = np.zeros(self.n, np.int64)
        self.data = np.zeros((total, row_bytes), np.uint8) if self.n else None
        #: the hit rate below which the cache is passed by
        self.line = FRAME_BYPASS_BELOW if row_bytes >= FRAME_ROW_BYTES else BYPASS_BELOW
        self.reads = 0  # reads that used the cache (lookups or placements)
        self._skipped = 0  # reads that passed it by since it was last used
        self._reset_judgement()

    def _reset_judgement(self) -> None:
        self.hit_rate = 1.0
        self._taken = self._hits = 0.0  # lookups that found their slot taken; hits

    def __bool__(self) -> bool:
        return self.n > 0

    def engaged(self) -> bool:
        """Whether the next read should use this cache (see the class's notes)."""
        return self.hit_rate >= self.line or self._skipped >= PROBE_EVERY - 1

    def skip(self) -> None:
        """Record a read that passed this cache by."""
        self._skipped += 1

    def _due(self) -> bool:
        """Count a read that uses the cache; whether it is to be judged (a probe, or one
        in :data:`JUDGE_EVERY`)."""
        self.reads += 1
        probe, self._skipped = self._skipped > 0, 0
        return probe or self.reads % JUDGE_EVERY == 0

    def _judge(self, held: np.ndarray, hit: np.ndarray) -> None:
        """Fold one read into ``hit_rate``: ``held[i]``, whether row ``i``'s slot was taken
        before the read; ``hit``: whether it held the row asked for. The counts of the
        last ~:data:`JUDGE_ROWS` taken slots weigh (halved as they pass it); until 1/8 of
        that is seen, the cache counts as useful."""
        self._taken += int(np.count_nonzero(held))
        self._hits += int(np.count_nonzero(hit))
        if self._taken >= 2 * JUDGE_ROWS:
            self._taken, self._hits = self._taken / 2, self._hits / 2
        if self._taken >= JUDGE_ROWS / 8:
            self.hit_rate = self._hits / self._taken

    def lookup(self, rows: np.ndarray, steps: np.ndarray, flat_out: np.ndarray) -> np.ndarray:
        """Copy cached rows into ``flat_out`` (``(len(rows), row_bytes)`` uint8); hit mask."""
        at = rows % self.n
        held = self.tag[at]
        hit = (held == rows + 1) & (self.step[at] == steps)
        if self._due():
            self._judge(held > 0, hit)
        if hit.any():
            copy_rows(self.data, at[hit], flat_out, np.flatnonzero(hit))
        return hit

    def insert(self, rows: np.ndarray, steps: np.ndarray, flat_rows: np.ndarray) -> None:
        """Keep decoded ``flat_rows`` (one per row) for (row, step)."""
        if not len(rows):
            return
        at, first = np.unique(rows % self.n, return_index=True)
        self.tag[at] = rows[first] + 1
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
        judged = self._due()
        held = self.tag[rows % self.n] > 0 if judged else None
        if native is not None:
            pos, hit, own = (np.empty(len(rows), np.int64), np.empty(len(rows), bool),
                             np.empty(len(rows), bool))
            placed = native.place_rows(
                np.ascontiguousarray(rows, np.int64), np.ascontiguousarray(steps, np.int64),
                np.ascontiguousarray(servable, bool),
                np.ascontiguousarray(servable if cacheable is None else cacheable, bool),
                self.tag, self.step, self.n, self.scratch, pos, hit, own)
            if not placed:
                return None
            if judged:
                self._judge(held, hit)
            return pos, hit, own
        at = rows % self.n
        hit = (self.tag[at] == rows + 1) & (self.step[at] == steps) & servable
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
        self.tag[at[own]] = 0
        if judged:
            self._judge(held, hit)
        return pos, hit, own

    def keep(self, rows: np.ndarray, steps: np.ndarray) -> None:
        """Record that ``rows`` (each placed ``own``) now hold the data of ``steps``."""
        at = rows % self.n
        self.tag[at] = rows + 1
        self.step[at] = steps

    def forget(self, rows: np.ndarray, steps: np.ndarray) -> None:
        at = rows % self.n
        drop = (self.tag[at] == rows + 1) & (self.step[at] == steps)
        self.tag[at[drop]] = 0

    def clear(self) -> None:
        self.tag[:] = 0
        self.reads = self._skipped = 0
        self._reset_judgement()


@dataclass
class KernelRead:
    """What a kernel read of one field needs besides the rows and the field's
    :class:`FdTable` (which holds the rest, once): the reader's counters (a
    ``ReadStats``)."""

    stats: Any


def serve(table: ShardTable, cache: RowCache | None, kernel: bool, ctx: KernelRead,
          rows: np.ndarray, steps: np.ndarray, shards: np.ndarray, slots: np.ndarray,
          out: np.ndarray) -> tuple[np.ndarray, bool]:
    """Serve rows into ``out``: decoded values ``table`` holds (rows a cached trusted
    version holds: :meth:`ShardTable.ready`), frames from ``cache`` (those its version
    still holds; unless it is not :meth:`~RowCache.engaged`), and the rest with one
    ``read_rows`` kernel call, which opens shards as it needs.

    Returns the mask of rows served (the caller reads the rest the general way) and
    whether the kernel may be used again for this field.
    """
    stats = ctx.stats
    flat = out.reshape(len(out), -1).view(np.uint8)
    if cache and not cache.engaged():
        cache.skip()
        stats.row_cache_bypassed += 1
        cache = None
    ready = None
    if not table.per_row:
        done = ready = table.ready(shards, slots, steps)
        n = int(ready.sum())
        if n:
            out[ready] = table.take(shards[ready], slots[ready])
        stats.chunk_cache_hits += n
    else:  # (frames: the kernel checks each row's version itself)
        done = np.zeros(len(rows), bool)
        if cache:  # only rows the current version still holds (else: stale, as uncached)
            done = cache.lookup(rows, steps, flat)
            if done.any():
                done &= table.ready(shards, slots, steps)
            hits = int(done.sum())
            stats.row_cache_hits += hits
            stats.row_cache_misses += len(rows) - hits
    use = kernel and table.fds is not None
    todo = np.flatnonzero(~done) if use else np.zeros(0, np.int64)
    if len(todo):
        if table.per_row or not table.fills:
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


def serve_undecoded(table: ShardTable, ctx: KernelRead, shards: np.ndarray, slots: np.ndarray,
                    steps: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, bool]:
    """Every row of a field that keeps no decoded values (its budget holds compressed
    chunks, or nothing) into ``out`` with one kernel call, as :func:`serve` would make
    after finding no row ``ready``: the mask of rows served, and whether the kernel may
    be used again for this field."""
    flat = out.reshape(len(out), -1).view(np.uint8)
    done, kernel = table.fds.read(shards, slots, steps, np.arange(len(out), dtype=np.int64),
                                  flat, ctx.stats)
    ctx.stats.rows += int(done.sum())
    return done, kernel


def _read_filling(table: ShardTable, ctx: KernelRead, shards: np.ndarray, slots: np.ndarray,
                  steps: np.ndarray, dst: np.ndarray, flat: np.ndarray
                  ) -> tuple[np.ndarray, bool]:
    """Rows of a multi-row-chunk field into ``flat`` by the kernel, each shard's chunks
    decoded into a value slot of ``table`` and kept there (see :meth:`FdTable.read`)."""
    if table.full and (table.slot[shards] < 0).all():  # nothing to admit or refill
        return table.fds.read(shards, slots, steps, dst, flat, ctx.stats)
    uniq, inv = np.unique(shards, return_inverse=True)
    claimed = table.claim(uniq)
    held = claimed >= 0
    if not held.any():  # the hot set is full: rows decoded alone
        return table.fds.read(shards, slots, steps, dst, flat, ctx.stats)
    if table.code is not None:
        return _fill_codes(table, ctx, uniq, inv, claimed, shards, slots, steps, dst, flat)
    per_slot = table.values[0].nbytes
    chunks = table.values.reshape(len(table.values), -1).view(np.uint8)
    if table.chunk_rows < table.shard_rows:
        return _fill_chunks(table, ctx, uniq, inv, claimed, per_slot, chunks, shards, slots,
                            steps, dst, flat)
    got, kernel = table.fds.read(shards, slots, steps, dst, flat, ctx.stats, chunks,
                                 np.where(held, claimed * per_slot, -1)[inv])
    failed = np.zeros(len(uniq), bool)
    failed[inv[~got]] = True  # a row of the shard failed: its slot may hold anything
    table.commit(uniq[held & ~failed], table.fds)
    table.release(uniq[held & failed])
    return got, kernel


def _fill_codes(table: ShardTable, ctx: KernelRead, uniq: np.ndarray, inv: np.ndarray,
                claimed: np.ndarray, shards: np.ndarray, slots: np.ndarray, steps: np.ndarray,
                dst: np.ndarray, flat: np.ndarray) -> tuple[np.ndarray, bool]:
    """:func:`_read_filling` for a scalar held as codes: each claimed shard's rows are
    decoded into a scratch row (one chunk per shard: while the kernel reads the batch's
    rows; several: by :func:`_decode_whole_shards` after), then coded into its slot (its
    rows the version trusts), as many shards as :data:`FILL_SCRATCH_BYTES` holds decoded
    (the others' rows are read alone, and later batches fill them). Where the code book
    cannot hold a shard's values, none of this call's shards is kept (the table's
    :meth:`~ShardTable.spill`)."""
    fds = table.fds
    raw = table.shard_rows * table.dtype.itemsize
    over = np.flatnonzero(claimed >= 0)[max(1, FILL_SCRATCH_BYTES // raw):]
    if len(over):  # the rest are filled by later batches
        table.release(uniq[over])
        claimed[over] = -1
    held = claimed >= 0
    scratch = table.borrow_scratch(int(held.sum()) * raw).reshape(-1, raw)
    at = np.full(len(uniq), -1, np.int64)
    at[held] = np.arange(len(scratch), dtype=np.int64) * raw
    if table.chunk_rows < table.shard_rows:
        got, kernel = fds.read(shards, slots, steps, dst, flat, ctx.stats)
        keep, e, rows, kernel = _decode_whole_shards(table, ctx, uniq, inv, claimed, got,
                                                     kernel, scratch.reshape(-1), at, raw,
                                                     flat.shape[1])
    else:
        got, kernel = fds.read(shards, slots, steps, dst, flat, ctx.stats,
                               scratch.reshape(-1), at[inv])
        failed = np.zeros(len(uniq), bool)
        failed[inv[~got]] = True  # a row of the shard failed: its scratch may hold anything
        keep = np.flatnonzero(held & ~failed)
        e = fds.tab[uniq[keep]]
        rows = fds.trusted_rows(e, table.shard_rows)
    values = scratch.reshape(-1).view(table.dtype)
    coded = table.code.encode_shards(values, at[keep] // table.dtype.itemsize, rows,
                                     table.values, claimed[keep])
    table.return_scratch(scratch)
    if coded < len(keep):  # a shard the book cannot hold
        table.release(uniq[held])
        table.spill()
        return got, kernel
    table.hold(uniq[keep], e[:, fds.FIRST], rows, e[:, fds.TRUSTED])
    table.release(uniq[np.setdiff1d(np.flatnonzero(held), keep)])
    return got, kernel


def _fill_chunks(table: ShardTable, ctx: KernelRead, uniq: np.ndarray, inv: np.ndarray,
                 claimed: np.ndarray, per_slot: int, chunks: np.ndarray, shards: np.ndarray,
                 slots: np.ndarray, steps: np.ndarray, dst: np.ndarray, flat: np.ndarray
                 ) -> tuple[np.ndarray, bool]:
    """:func:`_read_filling` for shards of several chunks, decoded into their slots by
    :func:`_decode_whole_shards` once the batch's rows are read. ``per_slot`` and
    ``chunks``: a slot's bytes and the slots as bytes, as the caller has them."""
    got, kernel = table.fds.read(shards, slots, steps, dst, flat, ctx.stats)
    done, e, rows, kernel = _decode_whole_shards(table, ctx, uniq, inv, claimed, got, kernel,
                                                 chunks, claimed * per_slot, per_slot,
                                                 flat.shape[1])
    fds = table.fds
    table.hold(uniq[done], e[:, fds.FIRST], rows, e[:, fds.TRUSTED])
    table.release(uniq[np.setdiff1d(np.flatnonzero(claimed >= 0), done)])
    return got, kernel


def _decode_whole_shards(table: ShardTable, ctx: KernelRead, uniq: np.ndarray,
                         inv: np.ndarray, claimed: np.ndarray, got: np.ndarray, kernel: bool,
                         into: np.ndarray, at: np.ndarray, shard_bytes: int, row_bytes: int
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Shards of several chunks, after the batch's rows were read (``got``; that call
    opened the versions they need): every chunk of each claimed shard ``uniq[k]`` that
    holds rows of the version now open (its trusted rows) is decoded at byte ``at[k]`` of
    ``into`` (``shard_bytes`` a shard, ``row_bytes`` a row) by a second call, which opens
    nothing, so a shard's rows never mix two versions (a shard grows chunk by chunk: a
    chunk read from an older version may lack rows). Returns ``(done, entries, rows,
    kernel)``: the indexes into ``uniq`` whose chunks all decoded, their versions (rows of
    ``FdTable.tab``) and trusted rows, and whether the kernel may be used again."""
    fds = table.fds
    fill = np.flatnonzero((claimed >= 0) & (fds.tab[uniq, fds.FD] >= 0))
    fill = fill[~np.isin(fill, inv[~got])]  # (a row of the shard failed: not this time)
    e = fds.tab[uniq[fill]].copy()
    R, S = table.chunk_rows, table.shard_rows
    rows = fds.trusted_rows(e, S)
    n_chunks = -(-rows // R)
    if not (kernel and n_chunks.sum()):
        return fill[:0], e[:0], rows[:0], kernel
    owner = np.repeat(np.arange(len(fill)), n_chunks)
    c = np.arange(len(owner)) - np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
    scratch = np.empty((len(owner), row_bytes), np.uint8)
    ok, kernel = fds.read(uniq[fill][owner], c * R, e[owner, fds.FIRST] + c * R,
                          np.arange(len(owner), dtype=np.int64), scratch, ctx.stats, into,
                          at[fill][owner] + c * (shard_bytes // S * R))
    bad = np.zeros(len(fill), bool)
    bad[owner[~ok]] = True
    bad |= fds.tab[uniq[fill], fds.GEN] != e[:, fds.GEN]  # (reopened: not this time)
    return fill[~bad], e[~bad], rows[~bad], kernel


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
