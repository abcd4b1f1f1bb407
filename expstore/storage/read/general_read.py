"""The general read path of a :class:`~expstore.storage.read.reader.ShardReader`: any backend,
any state of the caches.

Rows the batch path cannot serve (a remote store, an overwritten version, a read error
or a failed check) are located in their shards' cached headers and indexes, read with the
handle those were read through (one ``read_ranges`` call per read), decoded, and
re-checked where the backend cannot pin versions; a shard that changed meanwhile is
re-opened and read again, and rows still missing are reported as stale. Inner chunks
holding many rows are decoded once and kept in a small LRU cache bounded in bytes.

``GeneralReads`` is a part of ``ShardReader`` kept in its own module: its methods use the
reader's caches, backend and counters (``self``), and the reader's batch path calls
``_read_general`` for what it leaves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ObjectChanged, StoreCorruptError
from ..backends import Handle
from ..format import EMPTY, HEADER_SIZE, ShardHead, index_size, parse_head
from ..native import native


class GeneralReads:
    """The general path's methods of :class:`~expstore.storage.read.reader.ShardReader`."""

    def _read_general(self, name: str, rows: np.ndarray, steps: np.ndarray,
                      out: np.ndarray, keep: bool = True) -> np.ndarray:
        """Any backend, any state of the caches: locate, (re)open, read, re-check.
        ``keep``: put decoded frames in the frame cache."""
        L = self.layout
        S = L.shard_rows
        R = L.chunk_rows(name)
        shards = rows // S
        slots = rows - shards * S
        order = np.argsort(shards, kind="stable")
        uniq, starts, counts = np.unique(shards[order], return_index=True, return_counts=True)
        parts = [(shard, order[a : a + c])
                 for shard, a, c in zip(uniq.tolist(), starts.tolist(), counts.tolist())]
        excluded: set[int] = set()
        for attempt in range(len(parts) + 3):
            ok, groups = self._locate(name, parts, slots, steps, excluded)
            try:
                if R == 1:
                    self._read_single(name, groups, rows, steps, slots, out, keep)
                else:
                    self._read_grouped(name, groups, slots, R, out)
                if not self.backend.pins_versions:
                    changed = self._recheck(name, groups, slots, R)
                    if changed:
                        raise ObjectChanged(changed)
                break
            except (ObjectChanged, StoreCorruptError) as e:
                if isinstance(e, StoreCorruptError):
                    if self.backend.pins_versions:
                        raise
                    changed = self._recheck(name, groups, slots, R)
                    if not changed:
                        raise
                else:
                    changed = e.handles
                ids = {id(h) for h in changed}
                hit = [g for g in groups if id(g[1]) in ids]
                if not hit:
                    raise
                for shard, _, head, sel in hit:
                    self._purge(name, shard, head, rows[sel], steps[sel])
                    self._drop(name, shard)
                if attempt >= 2:
                    excluded.update(g[0] for g in hit)
        n_ok = int(ok.sum())
        self.stats.stale += len(rows) - n_ok
        self.stats.rows += n_ok
        return ok

    def _locate(self, name: str, parts: list[tuple[int, np.ndarray]], slots: np.ndarray,
                steps: np.ndarray, excluded: set[int]
                ) -> tuple[np.ndarray, list[tuple[int, Handle, ShardHead, np.ndarray]]]:
        """Which rows the current shard versions hold, and (shard, handle, head, rows) groups.

        Cached versions that do not hold a requested step are re-opened (batched) once.
        """
        spl = self.layout.shards_per_lane
        newest = {}
        for shard, sel in parts:
            newest[shard] = top = int(steps[sel].max())
            self.known[shard // spl] = max(int(self.known[shard // spl]), top + 1)
        fresh = [shard for shard, _ in parts if (name, shard) not in self.heads]
        stale = []
        for shard, sel in parts:
            entry = self.heads.get((name, shard))
            if entry is not None and (
                    newest[shard] >= self._opened[(name, shard)][1]
                    or not entry[1].holds(slots[sel], steps[sel]).all()):
                stale.append(shard)
        self._open_heads(name, fresh + stale)  # (one request set for both)
        ok = np.zeros(len(slots), bool)
        groups = []
        for shard, sel in parts:
            entry = self.heads.get((name, shard))
            if entry is None or shard in excluded:
                continue
            self.heads.move_to_end((name, shard))
            good = entry[1].holds(slots[sel], steps[sel])
            ok[sel] = good
            if good.any():
                groups.append((shard, entry[0], entry[1], sel[good]))
        return ok, groups

    def _recheck(self, name: str, groups: list, slots: np.ndarray, R: int) -> list[Handle]:
        """Handles whose object no longer has the chunks we read at the offsets we used.

        For stores that cannot pin a version: after reading, the header is read again;
        within one lap rows are only appended, so unchanged offsets of the chunks read
        prove the bytes read belong to the rows asked for.
        """
        if not groups:
            return []
        n_chunks = self.layout.chunks_per_shard(name)
        size = index_size(n_chunks) + HEADER_SIZE
        raws = self.backend.read_ranges([(h, 0, size) for _, h, _, _ in groups],
                                        missing_ok=True)
        self.stats.requests += len(groups)
        changed = []
        for (_, h, head, sel), raw in zip(groups, raws):
            try:
                new = None if raw is None else parse_head(raw, n_chunks, "")
            except StoreCorruptError:
                new = None
            chunks = np.unique(slots[sel] // R)
            if new is None or new.first_step != head.first_step or \
                    not np.array_equal(new.offsets[chunks], head.offsets[chunks]) or \
                    not np.array_equal(new.nbytes[chunks], head.nbytes[chunks]):
                changed.append(h)
        return changed

    def _purge(self, name: str, shard: int, head: ShardHead, rows: np.ndarray,
               steps: np.ndarray) -> None:
        """Forget decoded data read through a version found replaced mid-read."""
        for key in [k for k in self.chunk_cache if k[0] == name and k[1] == shard
                    and k[3] == head.first_step and k[4] == head.n_rows]:
            self._cached_bytes -= self.chunk_cache.pop(key).nbytes
        cache = self.row_caches.get(name)
        if cache:
            cache.forget(rows, steps)

    def _read_single(self, name, groups, rows, steps, slots, out, keep=True) -> None:
        cache = self.row_caches.get(name)
        flat = out.reshape(len(out), -1).view(np.uint8)
        hit = cache.lookup(rows, steps, flat) if cache else np.zeros(len(rows), bool)
        reqs: list[tuple[Handle, int, int]] = []
        targets: list[tuple[int, int]] = []
        for shard, h, head, sel in groups:
            need = sel[~hit[sel]]
            self.stats.row_cache_hits += len(sel) - len(need)
            self.stats.row_cache_misses += len(need)
            offs = head.offsets[slots[need]]
            if (offs == EMPTY).any():
                raise StoreCorruptError(f"{self.backend.url}/{self.layout.shard_key(name, shard)}"
                                        ": a row its header counts has no chunk")
            ends = offs + head.nbytes[slots[need]]
            reqs.extend(zip([h] * len(need), offs.tolist(), ends.tolist()))
            targets.extend((i, shard) for i in need.tolist())
        if not reqs:
            return
        blobs = self.backend.read_ranges(reqs)
        self.stats.requests += len(reqs)
        self.stats.chunks += len(reqs)
        dst = np.fromiter((i for i, _ in targets), np.int64, len(targets))
        if not self._decode_kernel(name, blobs, dst, flat):
            decode_into = self.decoders[name]
            try:
                for (i, _), blob in zip(targets, blobs):
                    decode_into(blob, flat[i])
            except Exception as e:  # numcodecs raises RuntimeError/ValueError variants
                bad = self._first_bad(name, targets, blobs, flat)
                raise StoreCorruptError(f"{self.backend.url}/"
                                        f"{self.layout.shard_key(name, bad)}: "
                                        f"a chunk does not decode ({e})") from e
        self.stats.bytes += sum(len(b) for b in blobs)
        if cache and keep:
            cache.insert(rows[dst], steps[dst], flat[dst])

    def _decode_kernel(self, name: str, blobs: list, dst: np.ndarray, flat: np.ndarray) -> bool:
        """Decode ``blobs`` into rows ``dst`` of ``flat`` with the C kernel; False when it
        cannot (no kernel, another codec, or a chunk fails: the caller's loop reports it)."""
        if not self.kernel_ok[name]:
            return False
        status, _ = native.decode_blobs(blobs, dst, flat, flat.shape[1], self.layout.checksum)
        if status == native.STATUS_UNSUPPORTED:
            self.kernel_ok[name] = False
        return status == native.STATUS_OK

    def _first_bad(self, name, targets, blobs, flat) -> int:
        decode_into = self.decoders[name]
        for (i, shard), blob in zip(targets, blobs):
            try:
                decode_into(blob, flat[i])
            except Exception:
                return shard
        return targets[0][1]

    def _read_grouped(self, name, groups, slots, R, out) -> None:
        f = self.layout.fields[name]
        uses = []
        pending: dict[tuple, tuple[Handle, int, int, int]] = {}
        got: dict[tuple, np.ndarray] = {}  # held here: reads below may evict cache entries
        for shard, h, head, sel in groups:
            chunk_of = slots[sel] // R
            for c in np.unique(chunk_of).tolist():
                key = (name, shard, c, head.first_step, head.n_rows,
                       self._opened[(name, shard)][0])
                uses.append((key, c, sel[chunk_of == c]))
                if key in got or key in pending:
                    continue
                hit = self.chunk_cache.get(key)
                if hit is not None:
                    self.chunk_cache.move_to_end(key)
                    self.stats.chunk_cache_hits += 1
                    got[key] = hit
                    continue
                if head.offsets[c] == EMPTY:
                    raise StoreCorruptError(f"{self.backend.url}/"
                                            f"{self.layout.shard_key(name, shard)}: "
                                            f"chunk {c} is missing")
                off, n = int(head.offsets[c]), int(head.nbytes[c])
                pending[key] = (h, off, off + n, shard)
        if pending:
            blobs = self.backend.read_ranges([v[:3] for v in pending.values()])
            self.stats.requests += len(pending)
            self.stats.chunks += len(pending)
            for (key, (_, _, _, shard)), blob in zip(pending.items(), blobs):
                self.stats.chunk_cache_misses += 1
                self.stats.bytes += len(blob)
                arr = np.empty((R, *f.shape), f.dtype)
                try:
                    self.decoders[name](blob, arr.reshape(-1).view(np.uint8))
                except Exception as e:
                    raise StoreCorruptError(
                        f"{self.backend.url}/{self.layout.shard_key(name, shard)}: chunk "
                        f"{key[2]} does not decode ({e})") from e
                got[key] = arr
                self._cache_put(key, arr)
        for key, c, pick in uses:
            out[pick] = got[key][slots[pick] - c * R]

    def _cache_put(self, key: tuple, arr: np.ndarray) -> None:
        self.chunk_cache[key] = arr
        self._cached_bytes += arr.nbytes
        while self._cached_bytes > self.chunk_cache_bytes and len(self.chunk_cache) > 1:
            _, old = self.chunk_cache.popitem(last=False)
            self._cached_bytes -= old.nbytes


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
