"""Training through damage: a row source that skips the rows of chunks failing their checks.

``make_loader(..., skip_corrupt=True)`` (or any sampler made with ``skip_corrupt=True``, or
``store.skip_corrupt = True``) wraps each reading process's row source in
:class:`SkipCorruptSource`. A read that raises :class:`~expstore.errors.StoreCorruptError`
for a shard of a field is probed chunk by chunk: each inner chunk that fails is put in this
process's in-memory quarantine (:class:`CorruptShards`) with the lap it was read in (the
shard version's first lane step), logged once (logger ``expstore``), and the other rows are
read again. A shard whose index or header fails quarantines that lap of the whole shard.
Rows of a quarantined chunk of that lap come back not ``ok``, so the loader replaces the
samples whose reads touch them (a frame: every stack that includes it) with spares,
exactly as it replaces rows overwritten in flight; the same slots rewritten by a later lap
are read again. Nothing is written to the store: ``expstore verify`` / ``expstore repair``
still find and quarantine the damage for good. ``rows_skipped`` counts the rows not
delivered (loader stats: ``corrupt_rows_skipped``). In the store's own process each new
corrupt chunk is also told to ``on_shard``, which marks its rows of that lap lost in the
store's index, so samplers stop drawing them. DataLoader workers hand each new corrupt
chunk (with its lap) back with their batches; the loader's process then marks those rows
lost in the store's index (:func:`quarantine_lap`), logs the chunk once and counts its rows
once (``corrupt_rows_quarantined``), so its sampler never draws them again. The marks live
in RAM: a store reopened after ``expstore repair`` samples what the repair left intact.
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
from ..storage.format import Layout

log = logging.getLogger("expstore")

#: the shard key a corruption error names: ``<field>/c/<shard>[/0...]``
_SHARD = re.compile(r"(?:^|/)(?P<name>[^/\s:]+)/c/(?P<shard>\d+)(?:/0)*(?::|\s|$)")
#: errors about one inner chunk (anything else about a shard: its index or header)
_CHUNK_ERRORS = ("does not decode", "has no chunk", "is missing")

#: ``chunk`` of a quarantined lap of a whole shard (its index or header failed)
WHOLE_SHARD = -1

class CorruptShards:
    """Chunks found corrupt by this process, per lap (in memory only).

    ``bad[field]``: ``{(shard, chunk, first lane step of the lap), ...}`` (``chunk`` is
    :data:`WHOLE_SHARD` where the shard's index or header failed). ``new`` lists
    ``(field, shard, chunk, first step)`` not yet handed on (:meth:`take`); ``log=False``
    leaves the warning to the process that is handed them.
    """

    def __init__(self, on_shard: Callable[[str, int, int, int], None] | None = None,
                 log: bool = True) -> None:
        self.bad: dict[str, set[tuple[int, int, int]]] = {}
        self.rows_skipped = 0
        self.on_shard = on_shard  # told of each new corrupt (field, shard, chunk, first step)
        self.log = log
        self.new: list[tuple[str, int, int, int]] = []

    @property
    def shards(self) -> dict[str, set[int]]:
        """Shards with a corrupt chunk in some lap, per field."""
        return {name: {s for s, _, _ in v} for name, v in self.bad.items()}

    def add(self, name: str, shard: int, chunk: int, first_step: int,
            error: BaseException) -> None:
        key = (int(shard), int(chunk), int(first_step))
        if key in self.bad.setdefault(name, set()):
            return
        self.bad[name].add(key)
        self.new.append((name, *key))
        if self.on_shard is not None:
            self.on_shard(name, *key)
        if self.log:
            log.warning("expstore: skipping the rows of corrupt %s (skip_corrupt=True): %s; "
                        "run 'expstore verify' and 'expstore repair' on the store",
                        _what(name, shard, chunk, first_step), error_detail(error))

    def mask(self, layout: Layout, name: str, rows: np.ndarray,
             steps: np.ndarray) -> np.ndarray:
        """Which of ``rows`` (read at lane ``steps``) lie in a chunk of ``name`` found bad
        in the lap they are read from."""
        out = np.zeros(len(rows), bool)
        bad = self.bad.get(name)
        if not bad:
            return out
        S, R = layout.shard_rows, layout.chunk_rows(name)
        shard = shard_of_rows(layout, rows)
        chunk = (rows % S) // R
        lap = steps - steps % S
        for s, c, first in bad:
            out |= (shard == s) & (lap == first) & ((chunk == c) if c >= 0 else True)
        return out

    def take(self, k: int) -> list[tuple[str, int, int, int]]:
        """Up to ``k`` of the chunks found since the last call, oldest first."""
        out, self.new = self.new[:k], self.new[k:]
        return out


def _what(name: str, shard: int, chunk: int, first_step: int) -> str:
    where = f"shard {name}/c/{shard}" if chunk < 0 else f"chunk {chunk} of {name}/c/{shard}"
    return f"{where} (lap from lane step {first_step})"


def shard_of_rows(layout: Layout, rows: np.ndarray) -> np.ndarray:
    """Shard number of each row."""
    return (rows // layout.lane_capacity) * layout.shards_per_lane + \
        (rows % layout.lane_capacity) // layout.shard_rows


def quarantine_lap(index: Any, layout: Layout, name: str, shard: int, first_step: int,
                   chunk: int = WHOLE_SHARD) -> int:
    """Mark lost in ``index`` (a ``RowIndex``: never sampled again) the rows of ``chunk`` of
    ``shard`` (:data:`WHOLE_SHARD`: all its rows) that hold lane steps of the lap from
    ``first_step``, and log it once; returns how many rows were newly marked. Rows the
    lane has rewritten since (a later lap) are left be."""
    lay = layout
    lane, k = divmod(int(shard), lay.shards_per_lane)
    R = lay.chunk_rows(name)
    lo, hi = (0, lay.shard_rows) if chunk < 0 else (chunk * R, (chunk + 1) * R)
    rows = lane * lay.lane_capacity + k * lay.shard_rows + np.arange(lo, hi)
    steps = index.steps(rows)
    start, stop = first_step + lo, first_step + hi
    hit = (steps >= start) & (steps < stop) & ((index.flags[rows] & FLAG_BAD) == 0)
    n = int(np.count_nonzero(hit))
    if n:  # the rows after it are renumbered too: none stacks frames across it
        index.mark_lost(lane, [(start, stop)], start, int(index.count[lane]))
    log.warning("expstore: skipping the rows of corrupt %s (skip_corrupt=True): lane %d "
                "steps %d..%d (%d rows held) are no longer sampled; run 'expstore verify' "
                "and 'expstore repair' on the store", _what(name, shard, chunk, first_step),
                lane, start, stop - 1, n)
    return n


def shard_of(error: StoreCorruptError, name: str) -> int | None:
    """The shard of field ``name`` a corruption error names (``None``: another object)."""
    m = _SHARD.search(error.detail)
    if m is None or m.group("name") != name:
        return None
    return int(m.group("shard"))


class SkipCorruptSource:
    """A row source (``read(name, rows, steps, out) -> ok``) that delivers every row it can
    and reports rows of corrupt chunks as not ``ok`` instead of raising."""

    def __init__(self, source: Any, layout: Layout, found: CorruptShards | None = None,
                 on_shard: Callable[[str, int, int, int], None] | None = None,
                 log: bool = True) -> None:
        self.source = source
        self.layout = layout
        self.found = found if found is not None else CorruptShards(on_shard, log)
        self.pid = os.getpid()  # the process whose quarantine this is

    @property
    def stats(self) -> Any:
        return getattr(self.source, "stats", None)

    def read(self, name: str, rows: np.ndarray, steps: np.ndarray,
             out: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        steps = np.asarray(steps, np.int64)
        if not self.found.bad.get(name):
            try:
                return self.source.read(name, rows, steps, out)
            except StoreCorruptError as e:
                if shard_of(e, name) is None:
                    raise
        return self._read_around(name, rows, steps, out)

    def _probe(self, name: str, shard: int, error: StoreCorruptError, rows: np.ndarray,
               steps: np.ndarray, out: np.ndarray) -> None:
        """Find which chunks of ``shard`` among ``rows`` fail (each is added to the
        quarantine with its lap); rows of the others are read into ``out``."""
        lay = self.layout
        S, R = lay.shard_rows, lay.chunk_rows(name)
        mine = np.flatnonzero(shard_of_rows(lay, rows) == shard)
        lap = steps[mine] - steps[mine] % S
        if not any(w in error.detail for w in _CHUNK_ERRORS):  # its index or header
            for first in np.unique(lap).tolist():
                self.found.add(name, shard, WHOLE_SHARD, first, error)
            return
        key = ((rows[mine] % S) // R) * (1 << 40) + lap
        for k in np.unique(key).tolist():
            sel = mine[key == k]
            buf = np.empty((len(sel), *out.shape[1:]), out.dtype)
            try:
                self.source.read(name, rows[sel], steps[sel], buf)
            except StoreCorruptError as e:
                if shard_of(e, name) != shard:
                    raise
                self.found.add(name, shard, k >> 40, k & ((1 << 40) - 1), e)

    def _read_around(self, name: str, rows: np.ndarray, steps: np.ndarray,
                     out: np.ndarray) -> np.ndarray:
        ok = np.zeros(len(rows), bool)
        probed: set[int] = set()
        while True:
            bad = self.found.mask(self.layout, name, rows, steps)
            todo = np.flatnonzero(~bad)
            if not len(todo):
                break
            buf = np.empty((len(todo), *out.shape[1:]), out.dtype)
            try:
                got = self.source.read(name, rows[todo], steps[todo], buf)
            except StoreCorruptError as e:
                s = shard_of(e, name)
                if s is None or s in probed:
                    raise
                probed.add(s)
                self._probe(name, s, e, rows[todo], steps[todo], buf)
                continue
            out[todo] = buf
            ok[todo] = got
            break
        self.found.rows_skipped += int(np.count_nonzero(bad))
        return ok

    def read_held(self, name: str, rows: np.ndarray, steps: np.ndarray) -> Any:
        """The wrapped source's zero-copy read where it has one and no chunk of this field
        is known bad; ``None`` (use :meth:`read`) otherwise."""
        held = getattr(self.source, "read_held", None)
        if held is None or self.found.bad.get(name):
            return None
        rows = np.asarray(rows, np.int64)
        steps = np.asarray(steps, np.int64)
        try:
            return held(name, rows, steps)
        except StoreCorruptError as e:
            if shard_of(e, name) is None:
                raise
            return None  # :meth:`read` finds the bad chunks


def skipping_in_process(current: SkipCorruptSource | None, source: Any, layout: Layout,
                        on_shard: Callable[[str, int, int, int], None] | None = None
                        ) -> SkipCorruptSource:
    """This process's :class:`SkipCorruptSource`, reading ``source`` now: ``current``
    unless it is ``None`` or was made in another process (a forked child keeps its own
    quarantine). A new one leaves the warning to ``on_shard`` or to the process it hands
    its chunks to (``log=False``)."""
    if current is None or current.pid != os.getpid():
        current = SkipCorruptSource(None, layout, on_shard=on_shard, log=False)
    current.source = source
    return current
