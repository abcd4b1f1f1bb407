"""Scalars held as codes: a hot set past its budget keeps a flag in 1 bit a row, a discrete
action in 4 or 8, a reward of few values in 8, instead of 1, 8 and 4 bytes.

A scalar field (shape ``()``, multi-row chunks) that the hot set cannot hold decoded
whole at its own width may still hold every shard as codes: each row's index into a
:class:`CodeBook`, a table of ``2 ** bits`` of the field's values. A bool takes 1 bit a
row and an int with declared bounds ``low``/``high`` the fewest of 1, 2, 4 or 8 bits that
hold the range, both with a fixed book (code ``c`` is ``low + c``); any other int or float
takes 8 bits (256 values; an Atari reward takes 3) with a book learned as shards are
decoded (append-only: a code once given keeps its value), where the shards
:func:`few_values` reads at open hold few values (a continuous reward keeps its width). A
shard whose values the book cannot hold is not held: its rows are read from storage, as
past the budget (:meth:`~expstore.storage.read.shard_table.ShardTable.spill`).

Values round-trip exactly: the book keys a value by its bytes (``-0.0`` and ``0.0``, NaN
payloads, stay what they were). Codes are packed low bits first in each byte, so row ``at``
of a shard is bits ``at * bits ..`` of its slot (``hot_gather.h`` reads them the same way).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from ..format import EMPTY, Layout, parse_head
from ..native import read_kernel, unique_first

#: bits a row per code: the widths a byte splits into evenly
CODE_WIDTHS = (1, 2, 4, 8)
#: shards of a field whose width the spec does not bound (a float reward) read at open
PROBE_SHARDS = 3
#: distinct values those shards may hold for the field to be held as 8-bit codes (a
#: book of 256: room for the values later shards add), and at most one per this many of
#: their rows (a field of a new value every row is not few-valued in small shards either)
PROBE_MAX_VALUES = 64
PROBE_ROWS_PER_VALUE = 4


def code_bits(shape: tuple, dtype: np.dtype, low: object = None, high: object = None
              ) -> int | None:
    """Bits a row that codes of a scalar field take (``None``: not coded: a vector, or a
    dtype other than bool, int or float of at most 8 bytes)."""
    dtype = np.dtype(dtype)
    if tuple(shape) != () or dtype.kind not in "biuf" or dtype.itemsize > 8:
        return None
    if dtype.kind == "b":
        return 1
    span = _span(dtype, low, high)
    for bits in CODE_WIDTHS:
        if span is not None and span <= 1 << bits:
            return bits
    return 8


def book_for(dtype: np.dtype, bits: int, low: object = None, high: object = None
             ) -> CodeBook:
    """The code book of a field held in ``bits`` a row: fixed where the spec bounds its
    values (a bool: 0 and 1; an int: ``low`` on), else learned as shards are read."""
    dtype = np.dtype(dtype)
    if learned(dtype, low, high):
        return CodeBook(dtype, bits)
    return CodeBook(dtype, bits, 0 if dtype.kind == "b" else int(np.asarray(low)))


def learned(dtype: np.dtype, low: object = None, high: object = None) -> bool:
    """Whether a coded field's values are only known once read (a float, an int without
    both bounds or with more than 256 values between them): it is coded where
    :func:`few_values` finds few in its shards."""
    dtype = np.dtype(dtype)
    return dtype.kind != "b" and (_span(dtype, low, high) or 1 << 9) > 1 << 8


def _span(dtype: np.dtype, low: object, high: object) -> int | None:
    """Values an int field's declared bounds allow (``None``: not an int with both)."""
    if dtype.kind not in "iu" or low is None or high is None:
        return None
    return int(np.asarray(high)) - int(np.asarray(low)) + 1


def few_values(root: str, layout: Layout, name: str,
               decode: Callable[[bytes, np.ndarray], None]) -> bool:
    """Whether up to :data:`PROBE_SHARDS` shards of scalar ``name`` of the local store at
    ``root``, spread over it, hold at most :data:`PROBE_MAX_VALUES` distinct values
    together, and one per :data:`PROBE_ROWS_PER_VALUE` of their rows at most (read and
    decoded with ``decode``, the field's decoder). False where none is written yet, or
    one cannot be read: the field is then held at its own width."""
    f = layout.fields[name]
    n_shards = layout.capacity // layout.shard_rows
    seen: set[int] = set()
    probed = 0  # rows
    for shard in sorted({int(s) for s in np.linspace(0, n_shards - 1, PROBE_SHARDS)}):
        try:
            with open(os.path.join(root, layout.shard_key(name, shard)), "rb") as fh:
                buf = fh.read()
            head = parse_head(buf, layout.chunks_per_shard(name), name)
            if head.offsets[0] == EMPTY or head.n_rows <= 0:
                continue
            off, size = int(head.offsets[0]), int(head.nbytes[0])
            values = np.empty(layout.chunk_rows(name), f.dtype)  # (its first chunk)
            decode(buf[off:off + size], values)
        except Exception:  # noqa: BLE001 - a guess only: a shard being rewritten, a codec
            continue  # error, a damaged chunk (the read path finds and reports those)
        keys = values[:min(head.n_rows, len(values))].view(f"u{f.dtype.itemsize}")
        seen.update(np.unique(keys).tolist())
        probed += len(keys)
        if len(seen) > PROBE_MAX_VALUES:
            return False
    return probed > 0 and len(seen) * PROBE_ROWS_PER_VALUE <= probed


def packed_bytes(rows: int, bits: int) -> int:
    """Bytes that codes of ``rows`` rows take at ``bits`` a row."""
    return -(-rows * bits // 8)


class CodeBook:
    """A field's distinct values (``table``, ``2 ** bits`` entries of its dtype; the first
    ``size`` in use) and the packing of rows into codes. Shared by every slot of the
    field's hot set; only grows (a gather reading ``table`` without the GIL never sees an
    entry change)."""

    def __init__(self, dtype: np.dtype, bits: int, low: int | None = None) -> None:
        if bits not in CODE_WIDTHS:
            raise ValueError(f"CodeBook: bits must be one of {CODE_WIDTHS}, got {bits}")
        self.dtype = np.dtype(dtype)
        self.bits = bits
        self.table = np.zeros(1 << bits, self.dtype)
        self.size = 0
        self._code: dict[int, int] = {}  # a value's bytes (as an int) -> its code
        self._key_dtype = np.dtype(f"u{self.dtype.itemsize}")
        #: a book fixed from the start: code ``c`` is the value ``low + c`` (a bool, an
        #: int with declared bounds); ``None``: learned
        self.low = low
        if low is not None:
            self.table[:] = (low + np.arange(1 << bits)).astype(self.dtype)
            self.size = 1 << bits

    def encode(self, values: np.ndarray, out: np.ndarray) -> bool:
        """Pack the codes of ``values`` (a 1-D array of the field's dtype) into ``out``
        (uint8, at least :func:`packed_bytes` of them; the rest zeroed), adding values not
        yet in the book. False, the book unchanged and ``out`` undefined, where they need
        more codes than it has left."""
        if self.low is not None:
            codes = np.asarray(values).astype(np.int64) - self.low
            if len(codes) and (codes.min() < 0 or codes.max() >= 1 << self.bits):
                return False
            pack(codes.astype(np.uint8), self.bits, out)
            return True
        keys = np.ascontiguousarray(values, self.dtype).view(self._key_dtype)
        keys = keys.astype(np.int64)  # (u8 keys >= 2**63 come out < 0: sorted instead)
        first, inv = unique_first(keys)
        distinct = keys[first].tolist()
        new = [k for k in distinct if k not in self._code]
        if self.size + len(new) > len(self.table):
            return False
        raw = self.table.view(self._key_dtype)
        for k in new:
            raw[self.size] = k % (1 << (8 * self.dtype.itemsize))
            self._code[k] = self.size
            self.size += 1
        codes = np.array([self._code[k] for k in distinct], np.uint8)[inv]
        pack(codes, self.bits, out)
        return True

    def encode_shards(self, src: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                      pool: np.ndarray, slots: np.ndarray) -> int:
        """:meth:`encode` of many shards in one call: shard ``k``'s ``counts[k]`` values,
        at value ``starts[k]`` of ``src`` (1-D, the field's dtype), into row ``slots[k]``
        of ``pool`` (uint8, a slot a row). Returns the shards coded, in order, before the
        first the book could not hold (``len(slots)``: all); that one is left undefined.
        One pass in C where the kernels are built (``scalar_codes.h``), else ``encode``
        per shard."""
        starts = np.ascontiguousarray(starts, np.int64)
        counts = np.ascontiguousarray(counts, np.int64)
        slots = np.ascontiguousarray(slots, np.int64)
        native = read_kernel()
        if native is None or not src.flags.c_contiguous or not pool.flags.c_contiguous:
            for k, (at, n, slot) in enumerate(zip(starts.tolist(), counts.tolist(),
                                                  slots.tolist(), strict=True)):
                if not self.encode(src[at:at + n], pool[slot]):
                    return k
            return len(slots)
        itemsize = self.dtype.itemsize
        done, size = native.code_rows(
            src.view(np.uint8), starts * itemsize, counts, self.dtype.kind, itemsize,
            self.bits, self.low, self.table.view(np.uint8), self.size, pool,
            slots * pool.shape[1], pool.shape[1])
        if self.low is None:  # values the kernel added, keyed as encode keys them
            added = self.table.view(self._key_dtype)[self.size:size].astype(np.int64)
            for c, k in enumerate(added.tolist(), self.size):
                self._code[k] = c
        self.size = size
        return done

    def decode(self, packed: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Values of rows ``at`` (int64) out of ``packed`` (uint8; a row per entry of
        ``at``: ``packed[i]`` holds row ``at[i]``'s codes, as ``slots[slot, byte]``
        gathers them)."""
        return self.table[unpack(packed, at, self.bits)]


def pack(codes: np.ndarray, bits: int, out: np.ndarray) -> None:
    """``codes`` (uint8, each below ``2 ** bits``) packed into ``out`` low bits first."""
    n, m = len(codes), packed_bytes(len(codes), bits)
    if bits == 8:
        out[:n] = codes
    elif bits == 1:
        out[:m] = np.packbits(codes, bitorder="little")
    else:
        per = 8 // bits
        whole = np.zeros((m, per), np.uint8)
        whole.reshape(-1)[:n] = codes
        packed = whole[:, 0].copy()
        for k in range(1, per):
            packed |= whole[:, k] << np.uint8(k * bits)
        out[:m] = packed
    out[m:] = 0


def byte_of(at: np.ndarray, bits: int) -> np.ndarray:
    """The byte of a slot holding row ``at``'s code."""
    return (at * bits) >> 3


def unpack(packed: np.ndarray, at: np.ndarray, bits: int) -> np.ndarray:
    """Codes of rows ``at`` from ``packed`` (``packed[i]``: the byte holding row ``at[i]``)."""
    if bits == 8:
        return packed
    return (packed >> ((at * bits) & 7).astype(np.uint8)) & np.uint8((1 << bits) - 1)
