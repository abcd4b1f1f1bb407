"""A row's coded scalars as one code, so a batch's gather reads one byte a row for them all.

Past its budget at the fields' own widths the hot set holds scalars as codes
(``scalar_codes.py``), a pool per field: a 100M-row Atari store's action, reward and two
flags in 2.25 bytes a row. Each field's row is then its own random access into its pool,
and on this machine (a VM: a TLB miss each) ``gather_held`` took 85-88 µs for the four
fields of a batch of 256 where one field took 26 (RESULTS, item 3's "format changes").

:class:`JointCodes` keeps, beside the fields' pools, one byte a row: the code of the row's
tuple of the fields' codes (an Atari store's 18 actions x 3 rewards x 2 x 2 flags = 216
tuples). Each field's job in the gather reads those bytes with its own table (the field's
value in each tuple), so the kernel is the one it was and the later jobs find the lines the
first brought in. It is a copy, built shard by shard from the fields' own slots where they
hold one version of the shard, dropped for a shard whenever any of them changes it
(``ShardTable.on_change``) and checked row by row by the kernel like theirs: the fields'
pools stay the truth, and a shard the copy does not hold is served from them. A 257th
tuple turns it off (the fields' own codes serve as before).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .scalar_codes import byte_of, unpack
from .shard_table import ShardTable

#: tuples a byte codes
MAX_TUPLES = 256
#: most bits of the fields' codes together (the tuple lookup table: 2 ** this entries)
MAX_KEY_BITS = 20


class JointCodes:
    """One byte a row coding the tuple of ``tables``' codes (see module doc). The arrays
    ``first``, ``n_rows``, ``trusted``, ``slot`` and ``values`` are what ``gather_held``
    takes for a field; ``books[name]`` its table."""

    def __init__(self, tables: dict[str, ShardTable], n_shards: int, shard_rows: int) -> None:
        self.tables = tables
        self.shard_rows = shard_rows
        self.bits = {n: t.code.bits for n, t in tables.items()}
        offsets = np.cumsum([0, *self.bits.values()])[:-1]
        self.offsets = dict(zip(tables, (int(o) for o in offsets)))
        self.first = np.full(n_shards, -1, np.int64)
        self.n_rows = np.zeros(n_shards, np.int64)
        self.trusted = np.zeros(n_shards, np.int64)
        self.slot = np.arange(n_shards, dtype=np.int64)  # (every shard its own)
        self.values = np.zeros((n_shards, shard_rows), np.uint8)
        self.books = {n: np.zeros(MAX_TUPLES, t.code.table.dtype) for n, t in tables.items()}
        self._lookup = np.full(1 << int(sum(self.bits.values())), -1, np.int16)
        self.tuples = 0
        #: a tuple past MAX_TUPLES was met: no shard is held any more
        self.off = False
        self.served = 0  # batches gathered from here
        for t in tables.values():
            t.on_change = self.drop

    @classmethod
    def of(cls, reader: Any, budget: int) -> JointCodes | None:
        """The joint codes of ``reader``'s coded scalars, where it has two or more, each
        held whole, and ``budget`` bytes (its hot set's) hold a byte a row more beside
        everything its tables hold (values, codes and held chunks); else ``None``."""
        tables = {n: t for n, t in reader.tables.items()
                  if t.code is not None and not t.per_row and t.shape == ()
                  and reader.held_whole.get(n) and len(t.values)}
        layout = reader.layout
        n_shards = layout.capacity // layout.shard_rows
        held = sum(t.values.nbytes + (t.fds.held.nbytes if t.fds is not None
                                      and t.fds.held is not None else 0)
                   for t in reader.tables.values())  # (decoded, coded, held chunks)
        if (len(tables) < 2 or sum(t.code.bits for t in tables.values()) > MAX_KEY_BITS
                or held + n_shards * layout.shard_rows > budget):
            return None
        return cls(tables, n_shards, layout.shard_rows)

    def drop(self, shards: np.ndarray | int | slice) -> None:
        """Forget the copies of ``shards`` (a field's version of them changed)."""
        self.first[shards] = -1

    def close(self) -> None:
        for t in self.tables.values():
            t.on_change = None
        self.off = True
        self.first[:] = -1

    def usable(self, reader: Any, names: list[str]) -> bool:
        """Whether a gather of ``names`` is worth serving from here: two or more of them
        its fields, each still held whole."""
        mine = [n for n in names if n in self.tables]
        return not self.off and len(mine) >= 2 and all(reader.held_whole.get(n) for n in mine)

    def build(self, shards: np.ndarray) -> int:
        """Copy ``shards`` (distinct) from the fields' slots, each where every field holds
        the same version of it: the shards copied."""
        tabs = list(self.tables.items())
        t0 = tabs[0][1]
        copied = 0
        for s in shards.tolist():
            if self.first[s] >= 0 or t0.first[s] < 0:
                continue
            version = (t0.first[s], t0.n_rows[s], t0.trusted[s])
            if any(t.first[s] < 0 or t.slot[s] < 0
                   or (t.first[s], t.n_rows[s], t.trusted[s]) != version for _, t in tabs):
                continue
            m = int(min(version[1], max(0, version[2] - version[0])))
            at = np.arange(m, dtype=np.int64)
            key = np.zeros(m, np.int64)
            for n, t in tabs:
                packed = t.values[t.slot[s], byte_of(at, self.bits[n])]
                key |= unpack(packed, at, self.bits[n]).astype(np.int64) << self.offsets[n]
            if not self._learn(key):
                self.close()
                return copied
            self.values[s, :m] = self._lookup[key]
            self.first[s], self.n_rows[s], self.trusted[s] = version
            copied += 1
        return copied

    def _learn(self, key: np.ndarray) -> bool:
        """Give tuples ``key`` not seen yet their codes and each field's book its values
        for them; False where they pass :data:`MAX_TUPLES`."""
        new = np.unique(key[self._lookup[key] < 0])
        if not len(new):
            return True
        if self.tuples + len(new) > MAX_TUPLES:
            return False
        codes = np.arange(self.tuples, self.tuples + len(new))
        for n, t in self.tables.items():
            field_codes = (new >> self.offsets[n]) & ((1 << self.bits[n]) - 1)
            self.books[n][codes] = t.code.table[field_codes]
        self._lookup[new] = codes  # (books first: a gather never meets a code without them)
        self.tuples += len(new)
        return True

    def job(self, args: tuple, name: str) -> tuple:
        """A field's ``gather_held`` job (``args``) reading this copy instead of its pool."""
        return (args[0], self.first, self.n_rows, self.trusted, self.slot, self.values,
                args[6], (8, self.books[name]), *args[8:])

    def build_for(self, locs: list[tuple[np.ndarray, ...]]) -> int:
        """:meth:`build` the shards of ``locs``' rows (not skipped) not held yet: the
        shards copied."""
        rows = np.concatenate([loc[0] if len(loc) == 2 else loc[0][~loc[2]] for loc in locs])
        shards = np.unique(rows[rows >= 0] // self.shard_rows)
        shards = shards[shards < len(self.first)]
        return self.build(shards[self.first[shards] < 0])
