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
index, so samplers stop drawing them. DataLoader workers hand each new corrupt shard (with
the lane steps it held when it failed) back with their batches; the loader's process then
marks those rows lost in the store's index (:func:`quarantine_lap`), logs the shard once
and counts its rows once (``corrupt_rows_quarantined``), so its sampler never draws them
again. The marks live in RAM: a store reopened after ``expstore repair`` samples what the
repair left intact.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import StoreCorruptError, error_detail
from ..rows import FLAG_BAD
from ..storage.layout import Layout

log = logging.getLogger("expstore")

#: the shard key a corruption error names: ``<field>/c/<shard>[/0...]``
_SHARD = re.compile(r"(?:^|/)(?P<name>[^/\s:]+)/c/(?P<shard>\d+)(?:/0)*(?::|\s|$)")


class CorruptShards:
    """Shards found corrupt by this process: ``{field: {shard, ...}}`` (in memory only).

    ``new`` lists ``(field, shard, first lane step of the lap read)`` not yet handed on
    (:meth:`take`); ``log=False`` leaves the warning to the process that is handed them.
    """

    def __init__(self, on_shard: Callable[[str, int], None] | None = None,
                 log: bool = True) -> None:
        self.shards: dict[str, set[int]] = {}
        self.rows_skipped = 0
        self.on_shard = on_shard  # told of each new corrupt (field, shard)
        self.log = log
        self.new: list[tuple[str, int, int]] = []

    def add(self, name: str, shard: int, error: BaseException, first_step: int = -1) -> None:
        if shard in self.shards.setdefault(name, set()):
            return
        self.shards[name].add(shard)
        self.new.append((name, shard, int(first_step)))
        if self.on_shard is not None:
            self.on_shard(name, shard)
        if self.log:
            log.warning("expstore: skipping the rows of corrupt shard %s/c/%d "
                        "(skip_corrupt=True): %s; run 'expstore verify' and 'expstore repair' "
                        "on the store", name, shard, error_detail(error))

    def take(self, k: int) -> list[tuple[str, int, int]]:
        """Up to ``k`` of the shards found since the last call, oldest first."""
        out, self.new = self.new[:k], self.new[k:]
        return out


def quarantine_lap(index: Any, layout: Layout, name: str, shard: int, first_step: int) -> int:
    """Mark lost in ``index`` (a ``RowIndex``: never sampled again) the rows of ``shard`` that
    hold lane steps ``first_step .. first_step + shard_rows`` (``-1``: the steps it holds
    now), and log it once; returns how many rows were newly marked."""
    lay = layout
    lane, k = divmod(int(shard), lay.shards_per_lane)
    rows = lane * lay.lane_capacity + k * lay.shard_rows + np.arange(lay.shard_rows)
    steps = index.steps(rows)
    if first_step < 0:
        held = steps[steps >= 0]
        if not len(held):
            return 0
        first_step = int(held.max()) - int(held.max()) % lay.shard_rows
    stop = first_step + lay.shard_rows
    hit = (steps >= first_step) & (steps < stop) & ((index.flags[rows] & FLAG_BAD) == 0)
    n = int(np.count_nonzero(hit))
    if n:  # the rows after it are renumbered too: none stacks frames across it
        index.mark_lost(lane, [(first_step, stop)], first_step, int(index.count[lane]))
    log.warning("expstore: skipping the rows of corrupt shard %s/c/%d (skip_corrupt=True): "
                "lane %d steps %d..%d (%d rows held) are no longer sampled; run 'expstore "
                "verify' and 'expstore repair' on the store", name, shard, lane, first_step,
                stop - 1, n)
    return n


def lap_start(rows: np.ndarray, steps: np.ndarray, shards: np.ndarray, shard: int,
              shard_rows: int) -> int:
    """First lane step of the lap of ``shard`` that the newest of ``rows`` in it belongs to
    (``-1``: none of ``rows`` is in it)."""
    mine = steps[shards == shard]
    if not len(mine):
        return -1
    s = int(mine.max())
    return s - s % shard_rows


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
                 on_shard: Callable[[str, int], None] | None = None, log: bool = True) -> None:
        self.source = source
        self.layout = layout
        self.found = found if found is not None else CorruptShards(on_shard, log)
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
        steps = np.asarray(steps, np.int64)
        bad = self.found.shards.get(name)
        if not bad:
            try:
                return self.source.read(name, rows, steps, out)
            except StoreCorruptError as e:
                shard = shard_of(e, name)
                if shard is None:
                    raise
                self._add(name, shard, e, rows, steps)
        return self._read_around(name, rows, steps, out)

    def _add(self, name: str, shard: int, error: StoreCorruptError, rows: np.ndarray,
             steps: np.ndarray) -> None:
        first = lap_start(rows, steps, self._shards(rows), shard, self.layout.shard_rows)
        self.found.add(name, shard, error, first)

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
                self._add(name, s, e, rows, steps)
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
        rows = np.asarray(rows, np.int64)
        steps = np.asarray(steps, np.int64)
        try:
            return held(name, rows, steps)
        except StoreCorruptError as e:
            shard = shard_of(e, name)
            if shard is None:
                raise
            self._add(name, shard, e, rows, steps)
            return None
