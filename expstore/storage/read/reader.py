"""The hot read path: byte-range reads of single inner chunks, decoded into the batch.

Shard headers and indexes are cached with the handle they were read through (an open
file descriptor locally, an ETag-pinned object on S3), so every range read goes to the
version whose index we hold; stores that cannot pin versions re-read headers after the
data (see :meth:`ShardReader.read`). Headers of all uncached shards of a read are fetched
in one batch, and the chunks of one read in one ``read_ranges`` call (remote backends
merge ranges of one object into one ranged GET).
When a caller passes the lane steps it expects, a cached version that does not hold them
is re-opened once; rows still missing were overwritten meanwhile and are reported as
stale instead of being returned. Inner chunks holding many rows (scalar fields) are
decoded once and kept in a small LRU cache bounded in bytes.

On local stores a batch path runs first (:meth:`ShardReader._read_batch`): decoded shards
of scalar fields are mirrored as arrays (:class:`~expstore.storage.read.shard_table.ShardTable`),
so checking a batch's rows and finding their values takes a few numpy operations, and the
C kernel (``_kernels.read_rows``) reads everything else of a batch in one call without the
GIL: it opens the shards it needs itself, checks their headers, and reads each row's
16-byte index entry and then its chunk, so no shard's chunk index is held in RAM and a
batch costs the same in a store of any size (descriptors held open: a bounded set per
field, :class:`~expstore.storage.read.fd_table.FdTable`). Rows it cannot serve (overwritten,
or any read error or failed check) go through the general path above
(:mod:`~expstore.storage.read.general_read`), which re-opens, re-checks and reports.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ...errors import StoreCorruptError
from ..backends import Backend, Handle
from ..format import EMPTY, HEADER_SIZE, Layout, ShardHead, decoder, index_size
from ..native import apply_read_depth_env, native
from .fd_table import FdTable
from .general_read import GeneralReads, parse_head_retrying
from .hot_set import gather_held
from .joint_codes import JointCodes
from .kernel_budget import held_need, kernel_fd_budget, kernel_shares, take_fds
from .read_cache import KernelRead, RowCache, serve, serve_held, serve_undecoded
from .read_stats import ReadStats
from .scalar_codes import book_for, few_values
from .shard_table import ShardTable

__all__ = ["BATCH_ROWS", "ReadStats", "ShardReader", "StagedRead"]


#: ``read(rows, steps, out) -> (ok, committed)``: rows a writer staged (``read_held``)
StagedRead = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]

#: reads of more rows (loading the index, verifying) skip the batch path: they touch
#: every row of each shard, so the general path's per-shard work is already amortized
BATCH_ROWS = 1 << 16


class ShardReader(GeneralReads):
    """Reads rows of any field; one per process (handles are not shareable).

    ``chunk_cache_bytes``: decoded multi-row chunks (LRU); ``row_cache_bytes``: decoded
    single-row chunks (frames), split over the fields stored that way; ``values_budget``:
    multi-row shards held for the batch path, the hot set (``Store`` passes
    ``hot_bytes``; scalars: 14 B/row for action, reward and flags decoded), split over the
    fields stored that way fewest bytes per row read first: decoded (admitted as first
    read, never evicted: ``hot_set.py``), or for scalars short of half their shards, as
    compressed chunks. ``max_fds``: descriptors
    the kernel may hold open (default :func:`kernel_fd_budget`; it takes what the split
    gives its fields, none more than its shards), mostly for frames. Both
    splits: :func:`~expstore.storage.read.kernel_budget.kernel_shares`. ``map_bytes``:
    shard files mapped at once per frame field (``shard_maps.h``; default 0, none: a scan
    such as an export, ``verify`` or ``repair`` would keep every page it read mapped;
    ``Store.reader`` passes ``open(map_bytes=...)``). ``entry_bytes``: frame shards' chunk
    offsets held per frame field of many chunks (``shard_reads.h``; default
    :data:`~expstore.storage.read.fd_table.ENTRY_TABLE_BYTES`).
    """

    #: remote stores: (re)open a shard's heads of every field read so far together
    open_fields_together = True

    def __init__(self, backend: Backend, layout: Layout, max_open: int = 4096,
                 chunk_cache_bytes: int = 64 << 20, row_cache_bytes: int = 0,
                 values_budget: int = 128 << 20, max_fds: int | None = None,
                 map_bytes: int = 0, entry_bytes: int | None = None) -> None:
        self.backend = backend
        self.layout = layout
        self.max_open = max_open
        self.heads: OrderedDict[tuple[str, int], tuple[Handle, ShardHead]] = OrderedDict()
        self.chunk_cache: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.chunk_cache_bytes = chunk_cache_bytes
        self._cached_bytes = 0
        self.decoders = {n: decoder(layout.fields[n].resolved_codec(), layout.checksum)
                         for n in layout.fields}
        #: decoded single-row chunks (frames) per field, keyed by (row, step); 0 bytes = off
        self.row_caches = self._row_caches(row_cache_bytes)
        #: per-field arrays mirroring ``heads`` for the batch path (local stores only)
        self.tables: dict[str, ShardTable] = {}
        self.kernel_ok = {n: native is not None and self._kernel_codec(n)
                          for n in layout.fields}
        root = getattr(backend, "root", None)
        # Callers only ask for committed steps, so a lane's largest step asked for so far
        # (+1) is a committed count. A shard version opened after that count was committed
        # holds the right bytes for steps below it; steps above may be rows a killed writer
        # wrote but never committed (its successor writes other bytes there): a cached
        # version is re-opened before it serves a step at or above the count it was opened
        # at (``_opened``). ``known``: that count per lane (the kernel tables hold it).
        self.known = np.zeros(layout.lanes, np.int64)
        self._fd_share: weakref.finalize | None = None
        if backend.is_local and backend.pins_versions:
            n_shards = layout.capacity // layout.shard_rows
            fds = kernel_fd_budget(max_open) if max_fds is None else max_fds
            apply_read_depth_env()  # (the frame path's preads in flight: read_pool.h)
            local = isinstance(root, str)
            shares = kernel_shares(
                layout, fds, values_budget,
                (lambda n: held_need(root, layout, n)) if local else None,
                (lambda n: few_values(root, layout, n, self.decoders[n])) if local else None)
            # what the fields got (none more than its shards), given back when the reader
            # is closed, or collected if never closed
            self._fd_share = take_fds(self, sum(s.fds for s in shares.values()))
            for n, f in layout.fields.items():
                share, fdt = shares[n], None
                if self.kernel_ok[n] and isinstance(root, str):
                    fdt = FdTable(root, lambda s, n=n: layout.shard_key(n, s), n_shards,
                                  layout.chunks_per_shard(n), layout.chunk_rows(n),
                                  share.fds, self.known, layout.shards_per_lane,
                                  layout.checksum, f.row_nbytes,
                                  held_bytes=share.held_bytes, map_bytes=map_bytes,
                                  entry_table_bytes=entry_bytes)
                values = share.values_bytes + (share.held_bytes if fdt is None else 0)
                code = (None if share.code_bits is None else
                        book_for(f.dtype, share.code_bits, f.low, f.high))
                self.tables[n] = ShardTable(n_shards, layout.shard_rows, layout.chunk_rows(n),
                                            f.shape, f.dtype, values, fdt, code)
        #: how a batch reads each field: True where its hot set may hold every shard
        #: (decoded or as codes: :meth:`gather_held` serves it once filled), False where
        #: its rows come in multi-row chunks its hot set holds only part of (or none: held
        #: compressed; or a shard its code book could not hold), read per batch by
        #: :meth:`read_fields`; None (or absent) for frames (one row per chunk) and fields
        #: without the batch path
        self.held_whole: dict[str, bool | None] = {}
        self._judge_held_whole()
        self.values_budget = values_budget
        #: the coded scalars' joint codes (``joint_codes.py``); None: not judged yet (at the
        #: first gather, once the tables know their codes), False: none
        self.joint: JointCodes | None | bool = None
        me = weakref.ref(self)  # (not a cycle: a reader's memory goes with its last reference)

        def judge_held_whole() -> None:
            reader = me()
            if reader is not None:
                reader._judge_held_whole()

        for t in self.tables.values():
            t.on_spill = judge_held_whole
        self.stats = ReadStats()
        # ``_opened[(name, shard)] = (version token, trusted count)`` (see ``known``)
        self._kernel_read = KernelRead(self.stats)
        self._opened: dict[tuple[str, int], tuple[int, int]] = {}
        self._tokens = 0
        self._read_names: set[str] = set()  # fields read through heads so far

    def _judge_held_whole(self) -> None:
        self.held_whole.update({n: t.holds_whole for n, t in self.tables.items()})

    def joint_for(self, names: list[str]) -> JointCodes | None:
        """The joint codes a gather of ``names`` can be served from, if any."""
        if self.joint is None:
            self.joint = JointCodes.of(self, self.values_budget) or False
        joint = self.joint
        if joint is False or not joint.usable(self, names):
            if joint is not False and joint.off:
                joint.close()
                self.joint = False  # (its memory goes)
            return None
        return joint

    def _row_caches(self, budget: int) -> dict[str, RowCache]:
        sizes = {n: f.row_nbytes for n, f in self.layout.fields.items()
                 if self.layout.chunk_rows(n) == 1}
        total = sum(sizes.values()) or 1
        return {n: RowCache(b, budget * b // total, self.layout.capacity)
                for n, b in sizes.items()}

    def drop_chunks(self, name: str) -> None:
        """Forget the decoded multi-row chunks of ``name`` (e.g. metadata read once, when
        a store's index is loaded)."""
        for key in [k for k in self.chunk_cache if k[0] == name]:
            self._cached_bytes -= self.chunk_cache.pop(key).nbytes

    def set_row_cache_bytes(self, budget: int) -> None:
        """Resize the decoded-frame cache to ``budget`` bytes (its rows are dropped)."""
        self.row_caches = self._row_caches(budget)

    def _kernel_codec(self, name: str) -> bool:
        """Whether the C kernel decodes ``name``'s chunks (blosc with LZ4 or LZ4HC)."""
        cfg = self.layout.fields[name].resolved_codec()
        return cfg.get("name", "blosc") == "blosc" and cfg.get("cname", "lz4") in ("lz4", "lz4hc")

    def _put_head(self, name: str, shard: int, handle: Handle, head: ShardHead,
                  values: np.ndarray | None = None) -> None:
        self.heads[(name, shard)] = (handle, head)
        table = self.tables.get(name)
        if table is not None:
            table.bind(shard, handle, head, self._opened[(name, shard)][1], values)

    def _pop_head(self, name: str, shard: int) -> tuple[Handle, ShardHead] | None:
        entry = self.heads.pop((name, shard), None)
        table = self.tables.get(name)
        if table is not None:
            table.unbind(shard)
        return entry

    def close(self) -> None:
        """Close every shard held and give back this reader's share of the process's
        descriptor budget (readers made later get it)."""
        if self._fd_share is not None:
            self._fd_share()  # (runs once)
        for h, _ in self.heads.values():
            self.backend.close_object(h)
        self.heads.clear()
        if self.joint:
            self.joint.close()
        self.joint = False
        for table in self.tables.values():
            table.clear()
        self.chunk_cache.clear()
        self._cached_bytes = 0
        for cache in self.row_caches.values():
            cache.clear()

    def forget(self, shard: int) -> None:
        """Drop cached versions of ``shard`` (all fields), e.g. after this process wrote it."""
        for name in self.layout.fields:
            entry = self._pop_head(name, shard)
            if entry is not None:
                self.backend.close_object(entry[0])
            table = self.tables.get(name)
            if table is not None and table.fds is not None:
                table.fds.forget(shard)

    def head(self, name: str, shard: int, reopen: bool = False) -> tuple[Handle, ShardHead] | None:
        """Cached (handle, parsed header+index) of one shard of ``name``."""
        key = (name, shard)
        entry = self.heads.get(key)
        if entry is not None and not reopen:
            self.heads.move_to_end(key)
            return entry
        self._open_heads(name, [shard])
        entry = self.heads.get(key)
        self._trim_heads()
        return entry

    def _open_heads(self, name: str, shards: list[int]) -> None:
        """(Re)open shards of ``name`` and read their headers: one batched request set.

        On remote stores the same shards of the other fields this reader reads are
        (re)opened in that request set too where their cached version predates the lane's
        known count (a flush writes every field's object of a shard): one round trip for a
        new shard, not one per field. Missing shards are left out of the cache (remote
        handles find out on this read).
        """
        if not shards:
            return
        self._read_names.add(name)
        pairs = [(name, shard) for shard in shards]
        if self.open_fields_together and not self.backend.is_local:
            spl = self.layout.shards_per_lane
            for other in self._read_names - {name}:
                for shard in shards:
                    seen = self._opened.get((other, shard))
                    if seen is None or (other, shard) not in self.heads or \
                            seen[1] < int(self.known[shard // spl]):
                        pairs.append((other, shard))
        opened: list[tuple[str, int, Handle]] = []
        for nm, shard in pairs:
            old = self._pop_head(nm, shard)
            if old is not None:
                self.backend.close_object(old[0])
                self.stats.reopened += 1
            h = self.backend.open_object(self.layout.shard_key(nm, shard))
            if h is not None:
                opened.append((nm, shard, h))
        if not opened:
            return
        sizes = {nm: self._head_request(nm) for nm in {p[0] for p in opened}}
        raws = self.backend.read_ranges([(h, 0, sizes[nm]) for nm, _, h in opened],
                                        missing_ok=True)
        self.stats.requests += len(opened)
        bad: StoreCorruptError | None = None
        for (nm, shard, h), raw in zip(opened, raws):
            if raw is None or bad is not None:
                self.backend.close_object(h)
                continue
            n_chunks = self.layout.chunks_per_shard(nm)
            try:
                h, raw, head = parse_head_retrying(
                    self.backend, self.layout.shard_key(nm, shard), h, raw, sizes[nm],
                    n_chunks, self.stats)
            except StoreCorruptError as e:
                bad = e
                continue
            self.stats.bytes += len(raw)
            self._tokens += 1
            lane = shard // self.layout.shards_per_lane
            self._opened[(nm, shard)] = (self._tokens, int(self.known[lane]))
            values = None
            if len(raw) > index_size(n_chunks) + HEADER_SIZE:
                values = self._prefill(nm, shard, head, raw)
            self._put_head(nm, shard, h, head, values)
        if bad is not None:
            raise bad

    def _trim_heads(self) -> None:
        """Close the least recently used shard versions beyond ``max_open``; called once a
        read is done, so a read touching more shards than that still gets all its rows."""
        while len(self.heads) > self.max_open:
            old_name, old_shard = next(iter(self.heads))
            old_h, _ = self._pop_head(old_name, old_shard)
            self.backend.close_object(old_h)

    def _head_request(self, name: str) -> int:
        """Bytes to fetch when opening a shard of ``name``: header + index; for fields
        stored in multi-row chunks whose whole shard is small (at most 256 KiB raw), the
        whole object, so header and data cost one request and the batch path can keep
        the decoded shard."""
        n_chunks = self.layout.chunks_per_shard(name)
        size = index_size(n_chunks) + HEADER_SIZE
        if self.layout.chunk_rows(name) == 1:
            return size
        f = self.layout.fields[name]
        raw = self.layout.shard_rows * f.row_nbytes
        bound = raw + 64 * (n_chunks + 1)  # codec frame overhead per chunk
        return size + bound if raw <= 256 << 10 else size

    def _prefill(self, name: str, shard: int, head: ShardHead, raw: bytes) -> np.ndarray | None:
        """Decode the chunks a shard-opening read already brought into the chunk cache.

        Returns the whole shard's decoded rows when every chunk holding its ``n_rows``
        rows came with the read and decoded (for the batch path), else ``None``.
        """
        f = self.layout.fields[name]
        R = self.layout.chunk_rows(name)
        token = self._opened[(name, shard)][0]
        shard_values = np.zeros((self.layout.shard_rows, *f.shape), f.dtype)
        complete = True
        for c in range(len(head.offsets)):
            off, n = int(head.offsets[c]), int(head.nbytes[c])
            if head.offsets[c] == EMPTY or off + n > len(raw):
                complete &= c * R >= head.n_rows
                continue
            arr = shard_values[c * R : (c + 1) * R]
            try:
                self.decoders[name](raw[off : off + n], arr.reshape(-1).view(np.uint8))
            except Exception:
                complete = False
                continue  # the normal read path fetches it again and reports errors
            self.stats.chunks += 1
            self._cache_put((name, shard, c, head.first_step, head.n_rows, token), arr)
        return shard_values if complete else None

    def _drop(self, name: str, shard: int) -> None:
        entry = self._pop_head(name, shard)
        if entry is not None:
            self.backend.close_object(entry[0])

    def read(self, name: str, rows: np.ndarray, steps: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Decode ``rows`` of ``name`` into ``out`` (C-contiguous, ``(len(rows), *shape)``).

        ``steps`` are the lane steps the caller expects at those rows. Returns a bool mask
        of rows delivered; ``False`` rows were overwritten (or never written).

        Headers of every shard not cached are fetched in one batch. A shard replaced after
        its header was read (remote stores: :class:`ObjectChanged`, or the re-check of
        headers on stores that cannot pin versions) is re-opened and read again; a shard
        that keeps changing has its rows reported as not delivered.
        """
        return self._read_rows(name, rows, steps, out, run=False)

    def read_run(self, name: str, rows: np.ndarray, steps: np.ndarray, out: np.ndarray
                 ) -> np.ndarray:
        """:meth:`read` of consecutive rows (a lane's metadata into the index: open,
        ``refresh()``), chunk by chunk: the batch path, made for scattered rows, would
        decode a whole multi-row chunk for each row (~4 µs a row against ~0.2-0.6)."""
        return self._read_rows(name, rows, steps, out, run=True)

    def _read_rows(self, name: str, rows: np.ndarray, steps: np.ndarray, out: np.ndarray,
                   run: bool) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        steps = np.asarray(steps, np.int64)
        if not len(rows):
            return np.zeros(0, bool)
        try:
            table = self.tables.get(name)
            if run and table is not None and not table.per_row:
                return self._read_general(name, rows, steps, out)
            return self._read(name, rows, steps, out)
        finally:
            self._trim_heads()

    def _read(self, name: str, rows: np.ndarray, steps: np.ndarray, out: np.ndarray
              ) -> np.ndarray:
        table = self.tables.get(name)
        if table is None or len(rows) > BATCH_ROWS:  # large reads: per shard is cheaper
            return self._read_general(name, rows, steps, out)
        return self._rest_general(name, rows, steps, out,
                                  self._read_batch(name, table, rows, steps, out))

    def _rest_general(self, name: str, rows: np.ndarray, steps: np.ndarray, out: np.ndarray,
                      done: np.ndarray) -> np.ndarray:
        """Rows not ``done`` read the general way into ``out``: the mask of rows delivered."""
        if done.all():
            return done
        if not done.any():
            return self._read_general(name, rows, steps, out)
        rest = np.flatnonzero(~done)
        part = np.empty((len(rest), *out.shape[1:]), out.dtype)
        ok = done.copy()
        ok[rest] = self._read_general(name, rows[rest], steps[rest], part)
        out[rest] = part
        return ok

    def read_fields(self, names: list[str], rows: np.ndarray, steps: np.ndarray
                    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """:meth:`read` of several fields at the same rows: ``{name: (values, ok)}``.

        Fields whose hot set may hold every shard (:attr:`held_whole`) come in one kernel
        call (:func:`gather_held`) where it holds every row asked for; rows of the other
        fields whose decoded shards the batch path holds are located once for all of
        them; the rest go through :meth:`read`. Fields come back in the order asked.
        """
        rows = np.ascontiguousarray(rows, np.int64)
        steps = np.ascontiguousarray(steps, np.int64)
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        held = [n for n in names if self.held_whole.get(n) and len(self.tables[n].values)
                ] if native is not None and 0 < len(rows) <= BATCH_ROWS else []
        if held:
            vals = {n: np.empty((len(rows), *self.layout.fields[n].shape),
                                self.layout.fields[n].dtype) for n in held}
            if gather_held(self, [(rows, steps)], [(0, n, vals[n]) for n in held]):
                out = {n: (vals[n], np.ones(len(rows), bool)) for n in held}
        located = None
        for name in names:
            if name in out:
                continue
            f = self.layout.fields[name]
            vals = np.empty((len(rows), *f.shape), f.dtype)
            table = self.tables.get(name)
            if table is None or table.per_row or not 0 < len(rows) <= BATCH_ROWS:
                out[name] = (vals, self.read(name, rows, steps, vals))
                continue
            if located is None:
                S = self.layout.shard_rows
                shards = rows // S
                located = shards, rows - shards * S
                self._bump(shards, steps)
            shards, slots = located
            if not table.max_slots and table.fds is not None and self.kernel_ok[name]:
                done, self.kernel_ok[name] = serve_undecoded(table, self._kernel_read, shards,
                                                             slots, steps, vals)
                try:
                    out[name] = (vals, self._rest_general(name, rows, steps, vals, done))
                finally:
                    self._trim_heads()
                continue
            if native is not None and table.code is None and native.table_rows(
                    shards, slots, steps, table.first, table.n_rows, table.trusted, table.slot,
                    table.values, self.layout.shard_rows, vals):  # every row held: one loop
                ready = np.ones(len(rows), bool)
            else:
                ready = table.ready(shards, slots, steps)
                if not ready.all():
                    out[name] = (vals, self.read(name, rows, steps, vals))
                    continue
                vals[...] = table.take(shards, slots)
            self.stats.chunk_cache_hits += len(rows)
            self.stats.rows += len(rows)
            out[name] = (vals, ready)
        return {n: out[n] for n in names}  # (in the order asked)

    def gather_held(self, locs: list[tuple[np.ndarray, ...]],
                    jobs: list[tuple[int, str, np.ndarray]], copy: bool = True,
                    staged: dict[str, tuple[tuple, np.ndarray]] | None = None) -> bool:
        """A batch's small fields out of the hot set (and ``staged`` rows) in one kernel
        call (see :func:`~expstore.storage.read.hot_set.gather_held`)."""
        return gather_held(self, locs, jobs, copy, staged)

    def read_held(self, name: str, rows: np.ndarray, steps: np.ndarray,
                  staged: tuple[np.ndarray, StagedRead] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Rows of a frame field (one row per chunk) without copying them out of this
        reader's frame cache: ``(values, pos, ok)`` with row ``i`` in ``values[pos[i]]``
        (``ok`` as for :meth:`read`). ``values`` is the cache itself: valid until the next
        read of ``name``. ``None`` where this read cannot be served so (another field kind,
        no cache or kernel, a cache passed by, too many rows to place): use :meth:`read`.

        ``rows``/``steps`` must be distinct (row, step) pairs. ``staged = (mask, read)``:
        rows of ``mask`` are not committed (a writer's staged rows): they are read with
        ``read(rows, steps, out) -> (ok, committed)`` instead of from storage, except those
        it did not deliver and says are ``committed`` since.
        """
        table, cache = self.tables.get(name), self.row_caches.get(name)
        if (table is None or not table.per_row or table.fds is None or not cache
                or not cache.engaged() or not self.kernel_ok[name]
                or not 0 < len(rows) <= BATCH_ROWS):
            return None
        rows = np.asarray(rows, np.int64)
        steps = np.asarray(steps, np.int64)
        mask = None if staged is None else staged[0]
        shards, slots, ready = self._ready(table, rows, steps, mask)
        got = serve_held(table, cache, self._kernel_read, rows, steps, shards, slots, ready,
                         None if mask is None else ~mask)
        if got is None:
            return None
        pos, ok, self.kernel_ok[name] = got
        f = self.layout.fields[name]
        values = cache.data.view(f.dtype).reshape(len(cache.data), *f.shape)
        rest = np.flatnonzero(~ok)
        if mask is not None and len(rest):
            mine = rest[mask[rest]]
            if len(mine):
                part = np.empty((len(mine), *f.shape), f.dtype)
                got_staged, committed = staged[1](rows[mine], steps[mine], part)
                values[pos[mine[got_staged]]] = part[got_staged]
                ok[mine[got_staged]] = True
                late = mine[~got_staged & committed]  # committed meanwhile: on storage
                rest = np.union1d(rest[~mask[rest]], late)
                if len(late):
                    self._bump(shards[late], steps[late])
            else:
                rest = rest[~mask[rest]]
        if len(rest):  # not cached, or not trusted: the general path, not cached again
            part = np.empty((len(rest), *f.shape), f.dtype)  # (slots now held by this read)
            try:
                ok[rest] = self._read_general(name, rows[rest], steps[rest], part, keep=False)
            finally:
                self._trim_heads()
            values[pos[rest]] = part
        return values, pos, ok

    def _ready(self, table: ShardTable, rows: np.ndarray, steps: np.ndarray,
               staged: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shard and slot of each row, and which rows a cached trusted version holds.
        Steps asked for are committed (``known``), except those of ``staged``."""
        shards, slots = self._shard_slots(rows, steps, staged)
        return shards, slots, table.ready(shards, slots, steps)

    def _shard_slots(self, rows: np.ndarray, steps: np.ndarray,
                     staged: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Shard and slot of each row; ``known`` raised to the steps asked for, except
        those of ``staged`` (see :meth:`_ready`)."""
        S = self.layout.shard_rows
        shards = rows // S
        slots = rows - shards * S
        if staged is None:
            self._bump(shards, steps)
        elif not staged.all():
            self._bump(shards[~staged], steps[~staged])
        return shards, slots

    def _bump(self, shards: np.ndarray, steps: np.ndarray) -> None:
        if self.layout.lanes == 1:
            self.known[0] = max(int(self.known[0]), int(steps.max()) + 1)
        else:
            np.maximum.at(self.known, shards // self.layout.shards_per_lane, steps + 1)

    def _read_batch(self, name: str, table: ShardTable, rows: np.ndarray, steps: np.ndarray,
                    out: np.ndarray) -> np.ndarray:
        """Serve rows whose shard versions are cached and trusted, with array operations
        and one kernel call; a mask of rows served (the rest take the general path)."""
        shards, slots = self._shard_slots(rows, steps)
        done, self.kernel_ok[name] = serve(table, self.row_caches.get(name),
                                           self.kernel_ok[name], self._kernel_read,
                                           rows, steps, shards, slots, out)
        return done
