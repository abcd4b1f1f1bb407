"""Shard versions of one field held open for the C read kernel (``_kernels.read_rows``):
:class:`FdTable`, its descriptors, the versions they hold and the index entries read
through them, handed to the kernel once as a ``ReadState``. Local stores only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..native import native

#: index entries an FdTable remembers at most (32 B each: 16 MiB). A field of more than
#: four times as many chunks remembers, with each index read, only the entries the rest
#: of that run needs (32), not the 4 KiB page's 256 (``shard_reads.h``: ``entry_span``)
ENTRY_CACHE_ROWS = 1 << 19

#: bytes of whole shards' index entries a frame field's FdTable may hold (2.29 B per
#: chunk, ``shard_reads.h``), used where its chunks outnumber :data:`ENTRY_CACHE_ROWS`: a
#: frame then costs one read (the frame run), not two (its index entries first). 256 MiB
#: hold ~117M frames' entries; the shards loaded first keep their slots. Pages are taken as
#: shards are loaded
ENTRY_TABLE_BYTES = 256 << 20

#: bytes of a frame field's shard files an FdTable may map at once (``shard_maps.h``; the
#: default of ``open(map_bytes=...)``, per frame field): a warm frame run is then a copy
#: from memory, not a ``pread``. Address space, not RAM: mapped pages are the page
#: cache's (they count in RSS as ``RssFile``, reclaimed like any cached page)
MAP_BYTES = 64 << 30

#: columns of FdTable.tab (what the C kernel keeps per shard)
TAB_COLS = 8 if native is None else native.TAB_COLS
#: entries of FdTable.state, and those the mappings use (``shard_reads.h``)
STATE_LEN = 7 if native is None else native.STATE_LEN
ST_MAPPED = 3 if native is None else native.ST_MAPPED
ST_MAP_BUDGET = 4 if native is None else native.ST_MAP_BUDGET
ST_MAP_READS = 6 if native is None else native.ST_MAP_READS
ECACHE_COLS = 4 if native is None else native.ECACHE_COLS
#: chunks per block of held entries, and a block's bytes (one cache line: the offset of
#: its first chunk, u64, and each chunk's size, u16), and the columns of ``FdTable.entry_of``
ENTRY_BLOCK = 28 if native is None else native.ENTRY_BLOCK
ENTRY_BLOCK_BYTES = 64 if native is None else native.ENTRY_BLOCK_BYTES
ENTRY_OF_COLS = 3 if native is None else native.ENTRY_OF_COLS


class FdTable:
    """Shard versions of one field held open for the C kernel (the kernel reads through them).

    ``tab`` (int64, ``(n_shards, TAB_COLS)``) is written by ``_kernels.read_rows``: per
    shard its descriptor (-1: none), the header's first step and rows, the committed
    count the version is trusted for, and the file's mapping made through that descriptor
    (frames: ``map_bytes`` of them at most; 0, the default: none, as a ``ShardReader``'s;
    ``Store.reader`` passes ``open(map_bytes=...)``, default :data:`MAP_BYTES`). At most
    ``max_fds`` descriptors are open; beyond that the kernel closes the oldest opened
    (and drops its mapping). ``held_bytes``: an arena of compressed
    chunks (scalars: fields of multi-row chunks read past the hot set), see ``shard_reads.h``;
    ``entry_table_bytes`` (default :data:`ENTRY_TABLE_BYTES`): whole shards' indexes held
    for a frame field of more chunks than its entry cache holds. Local stores
    only. ``known``: the reader's committed counts per lane (changed in place by the
    reader; a shard the kernel opens is trusted for its lane's count), ``row_bytes``: bytes
    of one of the field's rows. All of it is handed to the kernel once, as ``state`` (a
    ``ReadState``); each :meth:`read` passes only the batch.
    """

    FD, FIRST, NROWS, TRUSTED, RINGPOS, GEN, MAP_AT, MAP_LEN = range(8)
    #: columns of ``held_tab``: arena position (-1: none), bytes, first step, rows, trusted
    H_POS, H_NB, H_FIRST, H_NROWS, H_TRUSTED = range(5)

    def __init__(self, root: str, key_of: Callable[[int], str], n_shards: int, n_chunks: int,
                 chunk_rows: int, max_fds: int, known: np.ndarray, shards_per_lane: int,
                 checksum: bool, row_bytes: int, max_entries: int | None = None,
                 held_bytes: int = 0, entry_table_bytes: int | None = None,
                 map_bytes: int = 0) -> None:
        probe = key_of(0)
        head, _, tail = probe.partition("/c/0")
        self.prefix = os.fsencode(os.path.join(root, head + "/c/"))
        self.suffix = os.fsencode(tail)
        self.n_chunks = n_chunks
        self.chunk_rows = chunk_rows
        self.tab = np.full((n_shards, TAB_COLS), -1, np.int64)
        self.tab[:, [self.FIRST, self.NROWS, self.TRUSTED, self.GEN, self.MAP_AT,
                     self.MAP_LEN]] = 0
        self.ring = np.full(max(1, min(max_fds, n_shards)), -1, np.int64)
        #: ring positions used, next to reuse, opens; bytes mapped, the most that may be,
        #: the judge's warm runs in a row, runs read through a mapping (``shard_reads.h``)
        self.state = np.zeros(STATE_LEN, np.int64)
        self.state[ST_MAP_BUDGET] = max(0, map_bytes)
        #: index entries read (direct-mapped by chunk; 32 B each), valid only with the
        #: descriptor they were read through: a store of up to ``max_entries`` chunks
        #: costs one read per chunk, not two
        max_entries = ENTRY_CACHE_ROWS if max_entries is None else max_entries
        self.entries = np.full((max(1, min(max_entries, n_shards * n_chunks)), ECACHE_COLS),
                               -1, np.int64)
        self.opened = 0  # shard versions opened so far
        #: held by each kernel call and by :meth:`forget`: the kernel changes ``tab`` and
        #: closes descriptors without the GIL, so no other thread may touch them meanwhile
        self._lock = threading.Lock()
        #: ``held_bytes`` > 0 (multi-row chunks): compressed chunks read are kept in this
        #: arena, oldest overwritten first, and later rows of the same version decoded
        #: from it without a read (pages taken as it fills); ``held_tab`` has a row per
        #: chunk (shard ``s``'s chunk ``c`` at ``s * n_chunks + c``)
        self.held = np.zeros(held_bytes, np.uint8) if held_bytes > 0 else None
        self.held_tab = np.full((n_shards * n_chunks if held_bytes > 0 else 0, 5), -1,
                                np.int64)
        self.held_state = np.zeros(1, np.int64)  # bytes written to the arena so far
        held = ((self.held, self.held_tab, self.held_state) if self.held is not None
                else (None, None, None))
        #: whole shards' index entries (frames whose chunks outnumber ``entries``): per
        #: slot its blocks (each chunk's offset and size, a cache line per ENTRY_BLOCK
        #: chunks); per shard its slot, the open its slot was loaded through and the open
        #: last tried (``shard_reads.h``)
        budget = ENTRY_TABLE_BYTES if entry_table_bytes is None else entry_table_bytes
        slot_bytes = -(-n_chunks // ENTRY_BLOCK) * ENTRY_BLOCK_BYTES
        slots = min(n_shards, budget // slot_bytes)
        whole = chunk_rows == 1 and n_shards * n_chunks > len(self.entries) and slots > 0
        self.entry_blocks = aligned_zeros(slots if whole else 0, slot_bytes, ENTRY_BLOCK_BYTES)
        self.entry_of = np.full((n_shards if whole else 0, ENTRY_OF_COLS), -1, np.int64)
        self.entry_state = np.zeros(1, np.int64)  # slots taken
        entries = ((self.entry_blocks, self.entry_of, self.entry_state) if whole else ())
        self.state_of_reads = native.ReadState(
            self.prefix, self.suffix, n_chunks, chunk_rows, shards_per_lane, row_bytes,
            checksum, known, self.tab, self.ring, self.state, self.entries, *held, *entries)

    def ready(self, shards: np.ndarray, slots: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Rows an open version holds and is trusted for (one kernel call: numpy's
        gather and four comparisons cost 60-80 us per batch of 256 stacks)."""
        out = np.empty(len(shards), bool)
        native.rows_held(self.state_of_reads, np.ascontiguousarray(shards, np.int64),
                         np.ascontiguousarray(slots, np.int64),
                         np.ascontiguousarray(steps, np.int64), out)
        return out

    def trusted_rows(self, entries: np.ndarray, shard_rows: int) -> np.ndarray:
        """Rows (from a shard's first) that the versions open in ``entries`` (rows of
        :attr:`tab`) hold and trust: what a cache may keep of each."""
        return np.clip(np.minimum(entries[:, self.NROWS],
                                  entries[:, self.TRUSTED] - entries[:, self.FIRST]),
                       0, shard_rows)

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
        args = (np.ascontiguousarray(shards, np.int64), np.ascontiguousarray(slots, np.int64),
                np.ascontiguousarray(steps, np.int64), np.ascontiguousarray(dst, np.int64),
                flat, ok, *extra)
        with self._lock:  # (the kernel runs without the GIL and changes the table)
            status, nbytes, opened, reads = native.read_rows(self.state_of_reads, *args)
        done = ok.view(bool)
        n = int(done.sum())
        self.opened += opened
        stats.requests += reads + opened  # index entries and chunks read, headers
        stats.chunks += n
        stats.bytes += int(nbytes)
        return done, status != native.STATUS_UNSUPPORTED

    def forget(self, shard: int) -> None:
        """Close the version of ``shard`` held (e.g. this process rewrote it). Waits for a
        kernel call of another thread on this table: that call may be closing or reopening
        the same descriptor (an actor thread's writer forgets the shards it wrote while a
        learner thread reads)."""
        with self._lock:
            if len(self.held_tab):
                c = self.n_chunks
                self.held_tab[shard * c: (shard + 1) * c, self.H_POS] = -1
            native.close_shard(self.state_of_reads, shard)  # (and its mapping)

    @property
    def mapped_bytes(self) -> int:
        """Bytes of shard files mapped now."""
        return int(self.state[ST_MAPPED])

    @property
    def mapped_reads(self) -> int:
        """Frame runs read through a mapping so far (the others: ``pread``)."""
        return int(self.state[ST_MAP_READS])

    def clear(self) -> None:
        """Close every descriptor held and drop the chunks held."""
        for shard in np.flatnonzero(self.tab[:, self.FD] >= 0).tolist():
            self.forget(shard)
        self.held_tab[:, self.H_POS] = -1


def aligned_zeros(rows: int, row_bytes: int, align: int) -> np.ndarray:
    """A zeroed ``(rows, row_bytes)`` uint8 array whose first byte is ``align``-byte aligned
    (numpy aligns to 16 at most): the entry table's blocks each fill one cache line."""
    buf = np.zeros(rows * row_bytes + align, np.uint8)
    at = -buf.ctypes.data % align
    return buf[at:at + rows * row_bytes].reshape(rows, row_bytes)
