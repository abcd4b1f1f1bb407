"""What a reader's C kernel may hold: its share of the process's file descriptors, and
how a reader's descriptors and value bytes are split over the fields it reads.

Descriptors let the kernel read a shard again without opening it (~8 µs: open, header
read, the close of the oldest); value bytes let it serve scalar rows from RAM. Frames
(one row per chunk) need descriptors most: each missed frame is read from its shard.
Scalars (multi-row chunks) are served from decoded values or held compressed chunks, and
need a descriptor only while a chunk is read.
"""

from __future__ import annotations

import os
import resource
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..format import Layout
from .scalar_codes import code_bits, learned, packed_bytes

#: descriptors the kernel may hold for the readers of this process that are alive
_fds_taken = [0]

#: descriptors for each field of one multi-row chunk per shard (scalars)
FDS_ONE_CHUNK = 64
#: descriptors for each of the store's own metadata fields (read when a store opens)
FDS_METADATA = 16


def kernel_fd_budget(max_open: int) -> int:
    """File descriptors the kernel may hold open for a new reader, all fields together:
    half of what the process may still open beyond what other readers' kernels took,
    ``max_open`` (this reader's general path) and 1024 spare; at least 64, at most 32,768
    (a 100M-row store of 4096-row shards has 24,415 per field; the soft limit is raised to
    65,536 where the hard limit allows, ``backends.local``).
    (When the process runs out anyway, the kernel closes its oldest descriptors.)"""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(64, min(32768, (soft - _fds_taken[0] - max_open - 1024) // 2))


def take_fds(owner: object, n: int) -> weakref.finalize:
    """Count ``n`` descriptors as taken by ``owner``'s kernel until the returned finalizer
    is called (at close) or ``owner`` is collected."""
    _fds_taken[0] += n
    return weakref.finalize(owner, _give_back_fds, n)


def _give_back_fds(n: int) -> None:
    _fds_taken[0] -= n


@dataclass
class KernelShare:
    """One field's share of a reader's kernel budgets: descriptors held open, bytes of
    decoded values (``ShardTable``), bytes of held compressed chunks (``FdTable``)."""

    fds: int
    values_bytes: int
    held_bytes: int
    #: bits a row its values are held in as codes (``scalar_codes.py``); ``None``: at
    #: the field's own width
    code_bits: int | None = None


def decoded_slots(n_shards: int, shard_bytes: int, budget: int) -> int:
    """Shards of ``shard_bytes`` decoded bytes each that ``budget`` bytes hold (at most
    all ``n_shards``)."""
    return int(min(n_shards, budget // max(1, shard_bytes)))


def worth_filling(slots: int, n_shards: int, values_per_row: int = 1) -> bool:
    """Whether decoded values for ``slots`` of ``n_shards`` shards are worth filling as
    rows are read (shards admitted while there is room, never evicted). Vectors (state
    observations, continuous actions: several values per row, floats that compress
    little): whenever one shard fits, so a row of a held shard is a copy and only the rest
    are read. Scalars (flags, counters, discrete actions, rewards): where at least half
    fit; with less, the same bytes hold more shards as compressed chunks."""
    if values_per_row > 1:
        return slots > 0
    return 2 * slots >= n_shards


#: headroom over the estimated compressed bytes of a field's shards its held arena keeps
HELD_HEADROOM = 1.25
#: shard files of a field stat'ed to estimate its compressed bytes
HELD_SAMPLE_SHARDS = 8


def held_need(root: str, layout: Layout, name: str) -> int | None:
    """Bytes of held chunks that would hold every chunk of field ``name`` of the local
    store at ``root``: ``HELD_HEADROOM`` x the shards x the median size of up to
    ``HELD_SAMPLE_SHARDS`` shard files, spread over the store. ``None`` where none is
    written yet (an arena of the full share, then)."""
    n_shards = layout.capacity // layout.shard_rows
    sizes = []
    for shard in sorted({int(s) for s in np.linspace(0, n_shards - 1, HELD_SAMPLE_SHARDS)}):
        try:
            sizes.append(os.stat(os.path.join(root, layout.shard_key(name, shard))).st_size)
        except OSError:
            continue
    if not sizes:
        return None
    return int(HELD_HEADROOM * n_shards * float(np.median(sizes)))


def holds_chunks(layout: Layout, name: str) -> bool:
    """Whether the compressed chunks of field ``name`` may be held in RAM (``FdTable``'s
    arena) where the hot set does not decode it: fields of one multi-row chunk per shard,
    and scalars (one value a row) in chunks of many rows (shards of more than
    ``Layout.scalar_chunk_rows``)."""
    rows = layout.chunk_rows(name)
    return rows > 1 and (rows == layout.shard_rows or int(
        np.prod(layout.fields[name].shape, dtype=np.int64)) == 1)


def kernel_shares(layout: Layout, fds: int, values_budget: int,
                  held_need_of: Callable[[str], int | None] | None = None,
                  few_values_of: Callable[[str], bool] | None = None
                  ) -> dict[str, KernelShare]:
    """Split a reader's ``fds`` descriptors and ``values_budget`` bytes over the fields.

    Bytes (:func:`split_value_bytes`) go to the fields batches read in multi-row chunks.
    A field of one chunk per shard, or one the hot set decodes whole or whose arena holds
    every compressed chunk, gets :data:`FDS_ONE_CHUNK` descriptors (fewer where an even
    split of ``fds`` gives fewer); the store's metadata fields get :data:`FDS_METADATA`
    each; the other fields batches read (frames, and fields read past the hot set in
    chunks of part of a shard) share the rest. No field gets more than it has shards (its
    table never holds more), so a reader takes the sum, not all of ``fds``: a small store
    opened first leaves a large one opened after it what its shards need (it took half of
    what the process had left, and a 100M-row store opened after a 1M-row one reopened 13
    frame shards per batch of 32).
    """
    spec = layout.spec.fields
    values, held, codes, all_in_ram = split_value_bytes(layout, values_budget, held_need_of,
                                                        few_values_of)
    light_ones = {n for n in spec if layout.chunk_rows(n) > 1 and (
        layout.chunk_rows(n) == layout.shard_rows or n in all_in_ram)}
    rest = [n for n in spec if n not in light_ones] or list(spec)
    light = [n for n in light_ones if n not in rest]
    left = fds - FDS_METADATA * (len(layout.fields) - len(spec))
    light_fds = max(2, min(FDS_ONE_CHUNK, left // max(1, len(spec))))
    per_field = max(2, (left - light_fds * len(light)) // max(1, len(rest)))
    n_shards = max(1, layout.capacity // layout.shard_rows)
    return {n: KernelShare(min(n_shards, FDS_METADATA if n not in spec else light_fds
                               if n in light else per_field),
                           values.get(n, 0), held.get(n, 0), codes.get(n))
            for n in layout.fields}


def split_value_bytes(layout: Layout, budget: int,
                      held_need_of: Callable[[str], int | None] | None = None,
                      few_values_of: Callable[[str], bool] | None = None
                      ) -> tuple[dict[str, int], dict[str, int], dict[str, int], set[str]]:
    """``budget`` bytes over the fields batches read in multi-row chunks: ``(decoded,
    held, codes, all_in_ram)``, bytes of decoded values (``ShardTable``) and of held
    compressed chunks (``FdTable``) per field, the bits a row of the decoded scalars held
    as codes, and the fields held whole (every shard decoded, or every chunk of a known
    size held).

    Where every such field's shards fit decoded, each gets what they take. Otherwise
    scalars count at the width of their codes
    (:func:`~expstore.storage.read.scalar_codes.code_bits`: a flag 1 bit, a discrete
    action 4 or 8; a float or an unbounded int 8 where ``few_values_of(name)`` says its
    shards hold few values, :func:`~expstore.storage.read.scalar_codes.few_values`),
    and the fields are decoded fewest bytes per row read first (an observation's row is read
    twice per transition, as obs and next_obs), so each byte serves the most reads (a
    100M-row frame store's two flags decoded whole where an even split by row bytes
    decoded none; a 100M-row store of 2-byte observations has all of them decoded).
    A field :func:`holds_chunks` (of one chunk per shard, or a scalar) first has an arena
    for held compressed chunks set aside (its share of ``budget`` by row bytes, or less:
    ``held_need_of(name)``, :func:`held_need`, every chunk with headroom); it is decoded
    where that arena and the bytes left make it :func:`worth_filling`, and keeps the arena
    otherwise.
    Bytes no field took top up arenas short of their need.
    """
    n_shards = layout.capacity // layout.shard_rows
    spec = layout.spec.fields
    row = {n: f.row_nbytes for n, f in spec.items() if layout.chunk_rows(n) > 1}
    whole = {n: n_shards * layout.shard_rows * b for n, b in row.items()}
    if sum(whole.values()) <= budget:
        return whole, {}, {}, set(whole)
    total = max(1, sum(row.values()))
    held_share = {n: budget * b // total for n, b in row.items()}  # (by the bytes stored)
    bits = {n: code_bits(f.shape, f.dtype, f.low, f.high) for n, f in spec.items()
            if n in row and holds_chunks(layout, n)}
    bits = {n: b for n, b in bits.items() if b is not None and b < 8 * row[n]
            and not (learned(spec[n].dtype, spec[n].low, spec[n].high)
                     and (few_values_of is None or not few_values_of(n)))}
    for n, b in bits.items():
        row[n] = b / 8
        whole[n] = n_shards * packed_bytes(layout.shard_rows, b)
    need = {}  # arenas: every chunk (None: not known)
    held = {}  # set aside first, given back to a field decoded after all
    for n in row:
        if holds_chunks(layout, n):
            need[n] = None if held_need_of is None else held_need_of(n)
            share = held_share[n]
            held[n] = share if need[n] is None else min(share, need[n])
    left = budget - sum(held.values())
    decoded = {}
    obs = set(layout.spec.obs_names)  # (read twice per transition: obs and next_obs)
    for n in sorted(row, key=lambda n: row[n] / (2 if n in obs else 1)):  # (stable)
        avail = left + held.get(n, 0)
        give = min(whole[n], avail)
        slots = decoded_slots(n_shards, whole[n] // n_shards, give)
        values_per_row = int(np.prod(spec[n].shape, dtype=np.int64))
        if slots and (n not in held or worth_filling(slots, n_shards, values_per_row)):
            decoded[n] = give
            held.pop(n, None)
            left = avail - give
    for n in held:
        if need[n] is None or held[n] < need[n]:
            more = left if need[n] is None else min(left, need[n] - held[n])
            held[n] += more
            left -= more
    all_in_ram = ({n for n, b in decoded.items() if b >= whole[n]}
                  | {n for n, b in held.items() if need[n] is not None and b >= need[n]})
    return decoded, held, {n: b for n, b in bits.items() if n in decoded}, all_in_ram
