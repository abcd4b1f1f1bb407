"""Vectorized lookups of cached shard versions for the batch read path: no Python per row
or per shard.

:class:`ShardTable` mirrors, as flat numpy arrays indexed by shard, what a
:class:`~expstore.storage.read.reader.ShardReader` holds for one field: the version of each
cached shard (first step, rows, the committed count it is trusted for, its file
descriptor), and per shard either the byte range of every inner chunk (fields stored one
row per chunk: frames) or the decoded values of the whole shard (fields stored many rows
per chunk: scalars, small vectors). Checking which rows of a batch a cached version
holds, and finding their bytes or values, is then a handful of array operations.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..format import ShardHead
from .fd_table import FdTable
from .kernel_budget import decoded_slots, worth_filling
from .scalar_codes import CodeBook, byte_of, packed_bytes


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
                 dtype: np.dtype, values_budget: int, fds: FdTable | None = None,
                 code: CodeBook | None = None) -> None:
        self.shard_rows = shard_rows
        self.chunk_rows = chunk_rows
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.first = np.full(n_shards, -1, np.int64)  # first lane step, -1: none cached
        self.n_rows = np.zeros(n_shards, np.int64)
        self.trusted = np.zeros(n_shards, np.int64)  # serves steps below this count
        self.fd = np.full(n_shards, -1, np.int32)
        self.slot = np.full(n_shards, -1, np.int64)  # row of the pool arrays, -1: none
        self.fds = fds
        self.values_budget = values_budget
        #: the field's values as codes (scalars past the budget at their own width:
        #: ``scalar_codes.py``), or ``None``: ``values`` holds them decoded
        self.code = None if chunk_rows == 1 else code
        #: a shard its code book could not hold was left out: the field is no longer
        #: held whole, and no shard is admitted any more
        self.spilled = False
        #: called after :meth:`spill` (the reader judges again which fields it holds whole)
        self.on_spill: Callable[[], None] | None = None
        self.opened = 0  # versions bound so far (shard opens of this field)
        #: called with the shards whose held version changed or went (``joint_codes.py``
        #: keeps its copies of them in step)
        self.on_change: Callable[[np.ndarray | int | slice], None] | None = None
        self._scratch: np.ndarray | None = None  # (borrow_scratch)
        self._size_slots()

    def _size_slots(self) -> None:
        """The pool of value slots the budget allows, all free. It is taken at its full
        size at once: zeroed pages from the system, each paid for (RSS) as slots are
        first written, and never copied (grown by doubling, the 100M-row store's first
        seconds spent 0.5 s copying slots into arrays twice the size, each fresh page
        zeroed first)."""
        self.max_slots = 0 if self.chunk_rows == 1 else decoded_slots(
            len(self.slot), self.slot_bytes, self.values_budget)
        if self.code is None:
            self.values = np.zeros((self.max_slots, self.shard_rows, *self.shape), self.dtype)
        else:
            self.values = np.zeros((self.max_slots, self.slot_bytes), np.uint8)
        self.owner = np.full(self.max_slots, -1, np.int64)  # shard of each slot, -1: free

    @property
    def slot_bytes(self) -> int:
        """Bytes one value slot (a shard's rows, decoded or as codes) takes."""
        if self.code is not None:
            return packed_bytes(self.shard_rows, self.code.bits)
        return self.shard_rows * self.dtype.itemsize * int(np.prod(self.shape))

    @property
    def holds_whole(self) -> bool | None:
        """Whether every shard may be held (decoded or as codes); ``None`` for frames."""
        if self.per_row:
            return None
        return self.max_slots >= len(self.slot) and not self.spilled

    def take(self, shards: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Rows ``at`` of held ``shards`` (their slots ready), decoded."""
        slots = self.slot[shards]
        if self.code is None:
            return self.values[slots, at]
        return self.code.decode(self.values[slots, byte_of(at, self.code.bits)], at)

    def keep(self, slot: int, values: np.ndarray, n_rows: int) -> bool:
        """Put a shard's decoded ``values`` into value slot ``slot`` (as codes: its first
        ``n_rows``, the rows it is trusted for); False where the code book cannot hold
        them (see :meth:`spill`)."""
        if self.code is None:
            self.values[slot] = values
            return True
        return self.code.encode(np.asarray(values).reshape(-1)[:n_rows], self.values[slot])

    def spill(self) -> None:
        """A shard's values did not fit the code book. If no shard holds codes yet (its
        first shard read already has too many values: stored past declared bounds), the
        field is held decoded at its own width instead, within the same bytes; else no
        shard is admitted any more (the rest are read from storage)."""
        if self.code is not None and not (self.first[self.slot >= 0] >= 0).any():
            self.code = None
            self.slot[:] = -1
            self.first[:] = -1
            self._changed(slice(None))
            self._size_slots()
        else:
            self.spilled = True
        if self.on_spill is not None:
            self.on_spill()

    def borrow_scratch(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of scratch (uint8) to decode shards into before they are coded
        (:func:`~.read_cache._fill_codes`), the table's own buffer when no other caller has
        it (grown to the largest asked), else a new one; hand it back with
        :meth:`return_scratch`. A buffer kept spares the system zeroing fresh pages for
        each fill: at 100M rows, the first seconds' fills asked for ~1.4 GB in all."""
        buf, self._scratch = self._scratch, None  # (taken under the GIL: one holder)
        if buf is None or len(buf) < nbytes:
            buf = np.empty(nbytes, np.uint8)
        return buf[:nbytes]

    def return_scratch(self, scratch: np.ndarray) -> None:
        """Keep the buffer a :meth:`borrow_scratch` gave (or a view of it) for the next
        fill; once every slot is taken (no more fills), let it go."""
        base = scratch
        while base.base is not None:
            base = base.base
        if self.full:
            self._scratch = None
        elif self._scratch is None or len(base) > len(self._scratch):
            self._scratch = base

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
        if not self.keep(s, values, max(0, min(head.n_rows, trusted - head.first_step))):
            self.unbind(shard)
            self.spill()
            return
        self.first[shard], self.n_rows[shard] = head.first_step, head.n_rows
        self.trusted[shard], self.fd[shard] = trusted, fd

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
        return self.spilled or not (self.owner < 0).any()

    def claim(self, shards: np.ndarray) -> np.ndarray:
        """Value slots for ``shards`` (distinct), to be filled by the kernel: their own slot
        if they hold one, else free ones while the budget has room; -1 where none is left
        (admission, not eviction: a slot once given to a shard stays its own, refilled when
        a lap rewrites the shard, so a store past the budget never churns; rows of shards
        without a slot are decoded alone, straight into the batch). The shards are not
        ready until :meth:`commit`."""
        s = self.slot[shards]
        need = np.flatnonzero(s < 0)
        if len(need) and not self.spilled:
            free = np.flatnonzero(self.owner < 0)[: len(need)]
            got = need[: len(free)]
            self.owner[free] = shards[got]
            self.slot[shards[got]] = free
            s[got] = free
        self.first[shards] = -1
        self._changed(shards)
        return s

    def commit(self, shards: np.ndarray, fds: FdTable) -> None:
        """Shards whose chunk the kernel decoded into their claimed slot: ready, as the
        version ``fds`` holds for them."""
        e = fds.tab[shards]
        self.hold(shards, e[:, fds.FIRST], e[:, fds.NROWS], e[:, fds.TRUSTED])

    def hold(self, shards: np.ndarray, first: np.ndarray, n_rows: np.ndarray,
             trusted: np.ndarray) -> None:
        """Shards whose claimed slot now holds rows ``0 .. n_rows`` of the version starting
        at lane step ``first``, trusted below ``trusted``: ready."""
        self.first[shards] = first
        self.n_rows[shards] = n_rows
        self.trusted[shards] = trusted
        self.fd[shards] = -1  # the descriptor is the kernel's
        self._changed(shards)

    def release(self, shards: np.ndarray) -> None:
        """Free the slots claimed for ``shards`` (the kernel did not fill them)."""
        s = self.slot[shards]
        held = s >= 0
        self.owner[s[held]] = -1
        self.slot[shards] = -1
        self.first[shards] = -1
        self._changed(shards)

    def unbind(self, shard: int) -> None:
        s = int(self.slot[shard])
        if s >= 0:
            self.owner[s] = -1
        self.slot[shard] = -1
        self.first[shard] = -1
        self.fd[shard] = -1
        self._changed(shard)

    def _changed(self, shards: np.ndarray | int | slice) -> None:
        if self.on_change is not None:
            self.on_change(shards)

    def clear(self) -> None:
        for shard in np.flatnonzero(self.slot >= 0).tolist():
            self.unbind(shard)
        if self.fds is not None:
            self.fds.clear()

    def _take_slot(self, shard: int) -> int:
        """A free value slot for ``shard`` (-1: the budget is full; nothing is evicted)."""
        if self.spilled:
            return -1
        free = np.flatnonzero(self.owner < 0)
        if not len(free):
            return -1
        s = int(free[0])
        self.owner[s] = shard
        self.slot[shard] = s
        return s

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
