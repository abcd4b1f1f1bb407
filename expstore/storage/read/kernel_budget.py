"""What a reader's C kernel may hold: its share of the process's file descriptors, and
how a reader's descriptors and value bytes are split over the fields it reads.

Descriptors let the kernel read a shard again without opening it (~8 µs: open, header
read, the close of the oldest); value bytes let it serve scalar rows from RAM. Frames
(one row per chunk) need descriptors most: each missed frame is read from its shard.
Scalars (one multi-row chunk per shard) are served from decoded values or held
compressed chunks, and need a descriptor only while a shard's chunk is read.
"""

from __future__ import annotations

import os
import resource
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..format import Layout

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
    """Bytes of held chunks that would hold every shard of field ``name`` (one chunk per
    shard) of the local store at ``root``: ``HELD_HEADROOM`` x the shards x the median
    size of up to ``HELD_SAMPLE_SHARDS`` shard files, spread over the store. ``None``
    where none is written yet (an arena of the full share, then)."""
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


def kernel_shares(layout: Layout, fds: int, values_budget: int,
                  held_need_of: Callable[[str], int | None] | None = None
                  ) -> dict[str, KernelShare]:
    """Split a reader's ``fds`` descriptors and ``values_budget`` bytes over the fields.

    Multi-row-chunk fields batches read share ``values_budget`` by row bytes. A field of
    one chunk per shard keeps it as decoded values where :func:`worth_filling` says so
    (vectors: one shard fits; scalars: half of them), else as held compressed chunks
    (an Atari action is 8 B decoded, about 1 B compressed), and gets
    :data:`FDS_ONE_CHUNK` descriptors (fewer where an even split of ``fds`` gives fewer).
    A held arena larger than ``held_need_of(name)`` (:func:`held_need`: every shard's
    chunk, with headroom; asked only of fields kept as held chunks) keeps that much, and
    the bytes left go to the fields that keep decoded values, by row bytes (a 100M-row
    store of 2-byte observations: all of its observations decoded, not a third). The
    store's metadata fields get :data:`FDS_METADATA` descriptors each; the other fields
    batches read (frames) share the rest.
    """
    n_shards = layout.capacity // layout.shard_rows
    spec = layout.spec.fields
    multi = {n: f.row_nbytes for n, f in spec.items() if layout.chunk_rows(n) > 1}
    one_chunk = {n for n in multi if layout.chunk_rows(n) == layout.shard_rows}
    rest = [n for n in spec if n not in one_chunk] or list(spec)
    light = [n for n in one_chunk if n not in rest]
    left = fds - FDS_METADATA * (len(layout.fields) - len(spec))
    light_fds = max(2, min(FDS_ONE_CHUNK, left // max(1, len(spec))))
    per_field = max(2, (left - light_fds * len(light)) // max(1, len(rest)))
    shares, spare = {}, 0
    for n, f in layout.fields.items():
        budget, held = values_budget * multi.get(n, 0) // max(sum(multi.values()), 1), 0
        shard_bytes = layout.shard_rows * f.row_nbytes
        if n in one_chunk and not worth_filling(decoded_slots(n_shards, shard_bytes, budget),
                                                n_shards, int(np.prod(f.shape, dtype=np.int64))):
            budget, held = 0, budget
            need = None if held_need_of is None else held_need_of(n)
            if need is not None and need < held:
                spare += held - need
                held = need
        count = FDS_METADATA if n not in spec else light_fds if n in light else per_field
        shares[n] = KernelShare(count, budget, held)
    takers = {n: multi[n] for n in multi if shares[n].values_bytes > 0}
    for n, row in takers.items():
        shares[n].values_bytes += spare * row // sum(takers.values())
    return shares
