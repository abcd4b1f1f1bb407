"""Training through damage: a row source that skips rows whose shard fails its checks.

``make_loader(..., skip_corrupt=True)`` wraps each reading process's row source in
:class:`SkipCorruptSource`. A read that raises :class:`~expstore.errors.StoreCorruptError`
for a shard of a field puts that shard in this process's in-memory quarantine
(:class:`CorruptShards`), logs one warning for it (logger ``expstore``), and reads the other
rows again; the rows of quarantined shards come back not ``ok``, so the loader replaces
their samples with spares, exactly as it replaces rows overwritten in flight. Nothing is
written to the store: ``expstore verify`` / ``expstore repair`` still find and quarantine the
damage for good. ``rows_skipped`` counts the rows not delivered (loader stats:
``corrupt_rows_skipped``). In the store's own process (``store.skip_corrupt = True``) each
new corrupt shard is also told to ``on_shard``, which marks its rows lost in the store's
index, so samplers stop drawing them.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import StoreCorruptError, error_detail
from ..storage.layout import Layout

log = logging.getLogger("expstore")

#: the shard key a corruption error names: ``<field>/c/<shard>[/0...]``
_SHARD = re.compile(r"(?:^|/)(?P<name>[^/\s:]+)/c/(?P<shard>\d+)(?:/0)*(?::|\s|$)")


class CorruptShards:
    """Shards found corrupt by this process: ``{field: {shard, ...}}`` (in memory only)."""

    def __init__(self, on_shard: Callable[[str, int], None] | None = None) -> None:
        self.shards: dict[str, set[int]] = {}
        self.rows_skipped = 0
        self.on_shard = on_shard  # told of each new corrupt (field, shard)

    def add(self, name: str, shard: int, error: BaseException) -> None:
        if shard in self.shards.setdefault(name, set()):
            return
        self.shards[name].add(shard)
        if self.on_shard is not None:
            self.on_shard(name, shard)
        log.warning("expstore: skipping the rows of corrupt shard %s/c/%d (skip_corrupt=True): "
                    "%s; run 'expstore verify' and 'expstore repair' on the store",
                    name, shard, error_detail(error))


def shard_of(error: StoreCorruptError, name: str) -> int | None:
    """The shard of field ``name`` a corruption error names (``None``: another object)."""
    m = _SHARD.search(error.detail)
    if m is None or m.group("name") != name:
        return None
    return int(m.group("shard"))


class SkipCorruptSource:
    """A row source (``read(name, rows, steps, out) -> ok``) that delivers every row it can
    and reports rows of corrupt shards as not ``ok`` instead of raising."""

    def __init__(self, source: Any, layout: Layout, found: CorruptShards | None = None,
                 on_shard: Callable[[str, int], None] | None = None) -> None:
        self.source = source
        self.layout = layout
        self.found = found if found is not None else CorruptShards(on_shard)
        self.pid = os.getpid()  # the process whose quarantine this is

    @property
    def stats(self) -> Any:
        return getattr(self.source, "stats", None)

    def _shards(self, rows: np.ndarray) -> np.ndarray:
        lay = self.layout
        return (rows // lay.lane_capacity) * lay.shards_per_lane + \
            (rows % lay.lane_capacity) // lay.shard_rows

    def read(self, name: str, rows: np.ndarray, steps: np.ndarray,
             out: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        bad = self.found.shards.get(name)
        if not bad:
            try:
                return self.source.read(name, rows, steps, out)
            except StoreCorruptError as e:
                shard = shard_of(e, name)
                if shard is None:
                    raise
                self.found.add(name, shard, e)
        return self._read_around(name, rows, np.asarray(steps, np.int64), out)

    def _read_around(self, name: str, rows: np.ndarray, steps: np.ndarray,
                     out: np.ndarray) -> np.ndarray:
        shard = self._shards(rows)
        ok = np.zeros(len(rows), bool)
        while True:
            todo = np.flatnonzero(~np.isin(shard, list(self.found.shards[name])))
            if not len(todo):
                break
            buf = np.empty((len(todo), *out.shape[1:]), out.dtype)
            try:
                got = self.source.read(name, rows[todo], steps[todo], buf)
            except StoreCorruptError as e:
                s = shard_of(e, name)
                if s is None or s in self.found.shards[name]:
                    raise
                self.found.add(name, s, e)
                continue
            out[todo] = buf
            ok[todo] = got
            break
        self.found.rows_skipped += int(len(rows) - np.count_nonzero(
            ~np.isin(shard, list(self.found.shards[name]))))
        return ok

    def read_held(self, name: str, rows: np.ndarray, steps: np.ndarray) -> Any:
        """The wrapped source's zero-copy read where it has one and no shard of these rows
        is known bad; ``None`` (use :meth:`read`) otherwise."""
        held = getattr(self.source, "read_held", None)
        if held is None or self.found.shards.get(name):
            return None
        try:
            return held(name, rows, steps)
        except StoreCorruptError as e:
            shard = shard_of(e, name)
            if shard is None:
                raise
            self.found.add(name, shard, e)
            return None
