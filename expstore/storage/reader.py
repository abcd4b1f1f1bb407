"""The hot read path: byte-range reads of single inner chunks, decoded into the batch.

Shard headers and indexes are cached with the handle they were read through (an open
file descriptor locally), so every range read goes to the version whose index we hold.
When a caller passes the lane steps it expects, a cached version that does not hold them
is re-opened once; rows still missing were overwritten meanwhile and are reported as
stale instead of being returned. Inner chunks holding many rows (scalar fields) are
decoded once and kept in a small LRU cache bounded in bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..errors import StoreCorruptError
from .backend import Backend, Handle
from .layout import Layout
from .shard import EMPTY, HEADER_SIZE, ShardHead, index_size, parse_head


@dataclass
class ReadStats:
    """Counters of one reader (rows, bytes, seconds)."""

    rows: int = 0
    chunks: int = 0
    bytes: int = 0
    requests: int = 0
    chunk_cache_hits: int = 0
    chunk_cache_misses: int = 0
    row_cache_hits: int = 0
    row_cache_misses: int = 0
    reopened: int = 0
    stale: int = 0
    extra: dict = field(default_factory=dict)


class ShardReader:
    """Reads rows of any field; one per process (handles are not shareable)."""

    def __init__(self, backend: Backend, layout: Layout, max_open: int = 4096,
                 chunk_cache_bytes: int = 64 << 20, row_cache_bytes: int = 0) -> None:
        self.backend = backend
        self.layout = layout
        self.max_open = max_open
        self.heads: OrderedDict[tuple[str, int], tuple[Handle, ShardHead]] = OrderedDict()
        self.chunk_cache: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.chunk_cache_bytes = chunk_cache_bytes
        self._cached_bytes = 0
        #: decoded single-row chunks (frames) by (field, row, step); 0 bytes = off
        self.row_cache: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.row_cache_bytes = row_cache_bytes
        self._row_bytes = 0
        self.codecs = {n: layout.codec(n) for n in layout.fields}
        self.stats = ReadStats()

    def close(self) -> None:
        for h, _ in self.heads.values():
            self.backend.close_object(h)
        self.heads.clear()
        self.chunk_cache.clear()
        self._cached_bytes = 0
        self.row_cache.clear()
        self._row_bytes = 0

    def forget(self, shard: int) -> None:
        """Drop cached versions of ``shard`` (all fields), e.g. after this process wrote it."""
        for name in self.layout.fields:
            entry = self.heads.pop((name, shard), None)
            if entry is not None:
                self.backend.close_object(entry[0])

    def head(self, name: str, shard: int, reopen: bool = False) -> tuple[Handle, ShardHead] | None:
        """Cached (handle, parsed header+index) of one shard of ``name``."""
        key = (name, shard)
        entry = self.heads.get(key)
        if entry is not None and not reopen:
            self.heads.move_to_end(key)
            return entry
        if entry is not None:
            self.backend.close_object(self.heads.pop(key)[0])
            self.stats.reopened += 1
        skey = self.layout.shard_key(name, shard)
        h = self.backend.open_object(skey)
        if h is None:
            return None
        n_chunks = self.layout.chunks_per_shard(name)
        size = index_size(n_chunks) + HEADER_SIZE
        (raw,) = self.backend.read_ranges([(h, 0, size)])
        self.stats.requests += 1
        try:
            head = parse_head(raw, n_chunks, f"{self.backend.url}/{skey}")
        except StoreCorruptError:
            self.backend.close_object(h)
            raise
        self.heads[key] = (h, head)
        while len(self.heads) > self.max_open:
            _, (old, _) = self.heads.popitem(last=False)
            self.backend.close_object(old)
        return h, head

    def read(self, name: str, rows: np.ndarray, steps: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Decode ``rows`` of ``name`` into ``out`` (shape ``(len(rows), *field.shape)``).

        ``steps`` are the lane steps the caller expects at those rows. Returns a bool mask
        of rows delivered; ``False`` rows were overwritten (or never written).
        """
        L = self.layout
        S = L.shard_rows
        R = L.chunk_rows(name)
        rows = np.asarray(rows, np.int64)
        steps = np.asarray(steps, np.int64)
        shards = rows // S
        slots = rows % S
        ok = np.zeros(len(rows), bool)
        entries: dict[int, tuple[Handle, ShardHead]] = {}
        for shard in np.unique(shards).tolist():
            sel = shards == shard
            entry = self.head(name, shard)
            good = entry[1].holds(slots[sel], steps[sel]) if entry else np.zeros(sel.sum(), bool)
            if not good.all():
                entry = self.head(name, shard, reopen=True)
                good = entry[1].holds(slots[sel], steps[sel]) if entry else good
            if entry is not None:
                entries[shard] = entry
            ok[sel] = good
        self.stats.stale += int((~ok).sum())
        idx = np.flatnonzero(ok)
        if R == 1:
            self._read_single(name, rows[idx], steps[idx], shards[idx], slots[idx], entries,
                              out, idx)
        else:
            self._read_grouped(name, shards[idx], slots[idx], R, entries, out, idx)
        self.stats.rows += len(idx)
        return ok

    def _read_single(self, name, rows, steps, shards, slots, entries, out, idx) -> None:
        uniq, first, pos = np.unique(rows, return_index=True, return_inverse=True)
        cache = self.row_cache if self.row_cache_bytes else None
        reqs, req_of = [], {}
        for u, i in enumerate(first.tolist()):
            if cache is not None:
                hit = cache.get((name, int(rows[i]), int(steps[i])))
                if hit is not None:
                    cache.move_to_end((name, int(rows[i]), int(steps[i])))
                    out[idx[i]] = hit
                    self.stats.row_cache_hits += 1
                    continue
                self.stats.row_cache_misses += 1
            h, head = entries[int(shards[i])]
            if head.offsets[slots[i]] == EMPTY:
                raise StoreCorruptError(f"{name}: shard {int(shards[i])} has no chunk for "
                                        f"row slot {int(slots[i])} though its header says so")
            off = int(head.offsets[slots[i]])
            req_of[u] = len(reqs)
            reqs.append((h, off, off + int(head.nbytes[slots[i]])))
        blobs = self.backend.read_ranges(reqs)
        self.stats.requests += len(reqs)
        self.stats.chunks += len(reqs)
        decode = self.codecs[name].decode
        for u, r in req_of.items():
            i = int(first[u])
            blob = blobs[r]
            self.stats.bytes += len(blob)
            target = out[idx[i] : idx[i] + 1]
            try:
                decode(blob, out=target)
            except Exception as e:  # numcodecs raises RuntimeError/ValueError variants
                raise StoreCorruptError(
                    f"{self.backend.url}/{self.layout.shard_key(name, int(shards[i]))}: "
                    f"chunk for slot {int(slots[i])} does not decode ({e})"
                ) from e
            if cache is not None:
                self._row_put((name, int(rows[i]), int(steps[i])), target[0].copy())
        dup = np.flatnonzero(first[pos] != np.arange(len(rows)))
        if len(dup):
            out[idx[dup]] = out[idx[first[pos[dup]]]]

    def _row_put(self, key: tuple, arr: np.ndarray) -> None:
        self.row_cache[key] = arr
        self._row_bytes += arr.nbytes
        while self._row_bytes > self.row_cache_bytes and self.row_cache:
            _, old = self.row_cache.popitem(last=False)
            self._row_bytes -= old.nbytes

    def _read_grouped(self, name, shards, slots, R, entries, out, idx) -> None:
        f = self.layout.fields[name]
        chunk_of = slots // R
        for shard in np.unique(shards).tolist():
            h, head = entries[shard]
            sel = np.flatnonzero(shards == shard)
            for c in np.unique(chunk_of[sel]).tolist():
                key = (name, shard, c, head.first_step, head.n_rows)
                arr = self.chunk_cache.get(key)
                if arr is None:
                    self.stats.chunk_cache_misses += 1
                    off, n = int(head.offsets[c]), int(head.nbytes[c])
                    if head.offsets[c] == EMPTY:
                        raise StoreCorruptError(f"{name}: shard {shard} chunk {c} is missing")
                    (blob,) = self.backend.read_ranges([(h, off, off + n)])
                    self.stats.requests += 1
                    self.stats.bytes += len(blob)
                    self.stats.chunks += 1
                    arr = np.empty((R, *f.shape), f.dtype)
                    try:
                        self.codecs[name].decode(blob, out=arr)
                    except Exception as e:
                        raise StoreCorruptError(
                            f"{self.backend.url}/{self.layout.shard_key(name, shard)}: chunk "
                            f"{c} does not decode ({e})") from e
                    self._cache_put(key, arr)
                else:
                    self.chunk_cache.move_to_end(key)
                    self.stats.chunk_cache_hits += 1
                pick = sel[chunk_of[sel] == c]
                out[idx[pick]] = arr[slots[pick] - c * R]

    def _cache_put(self, key: tuple, arr: np.ndarray) -> None:
        self.chunk_cache[key] = arr
        self._cached_bytes += arr.nbytes
        while self._cached_bytes > self.chunk_cache_bytes and len(self.chunk_cache) > 1:
            _, old = self.chunk_cache.popitem(last=False)
            self._cached_bytes -= old.nbytes
