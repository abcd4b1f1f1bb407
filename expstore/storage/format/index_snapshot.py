"""The index snapshot: each lane's per-row metadata (``_episode_step``, ``_flags``) in
large raw blocks, so that opening a store reads ~5 bytes per row in a few thousand objects
instead of decoding every metadata shard. An accelerator, never the truth: the lane state
says which steps exist, and a block missing, damaged, stale or of another store is not
used (those steps are read from the metadata shards, as without a snapshot).

A lane's ring is cut into blocks of :func:`block_rows` slots (the last one may be
shorter); block ``j`` of lane ``i`` is one object, ``_index/lane_<i>/block_<j>``::

    [ header length u32 LE ][ header: sealed JSON ][ episode_step i32 x rows ][ flags u8 x rows ]

The header (``envelope.seal``, kind ``index_block``) holds ``store_id``, ``lane``,
``block``, ``first_step`` (the lane step its first slot held in the lap written),
``rows`` and the crc32c of the payload. The lane's writer writes a block once per lap,
after the lane state commit that covered all of its rows. Metadata of a committed step
never changes, so a block is valid for the steps of it the lane still holds
(:func:`valid_steps`): ``[max(first_step, count - lane_capacity, valid_from),
min(first_step + rows, count))``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c
import numpy as np

from ...errors import StoreCorruptError
from ..backends import Backend
from .envelope import seal, unseal
from .layout import Layout

SNAPSHOT_VERSION = 1
#: slots per block at most (rows; 320 KiB of payload)
BLOCK_ROWS = 1 << 16
#: RAM the writers of a store keep for their lanes' open blocks together (bytes): a store
#: of many lanes gets smaller blocks (never below one shard)
WRITER_BYTES = 16 << 20
#: bytes per row of a block's payload (episode_step int32 + flags uint8)
ROW_BYTES = 5
_LEN = struct.Struct("<I")


def block_rows(layout: Layout) -> int:
    """Slots per block of ``layout``'s lanes: a whole number of shards, at most
    :data:`BLOCK_ROWS` and the lane, smaller for many lanes (:data:`WRITER_BYTES`)."""
    S = layout.shard_rows
    budget = min(BLOCK_ROWS, WRITER_BYTES // (ROW_BYTES * layout.lanes))
    return min(max(1, budget // S) * S, layout.lane_capacity)


def blocks_per_lane(layout: Layout) -> int:
    return -(-layout.lane_capacity // block_rows(layout))


def block_key(lane: int, block: int) -> str:
    return f"_index/lane_{lane}/block_{block}"


def lane_prefix(lane: int) -> str:
    """Key prefix of lane ``lane``'s blocks."""
    return f"_index/lane_{lane}/"


def block_of(layout: Layout, step: int) -> tuple[int, int, int]:
    """``(block, first_step, rows)`` of the block holding lane step ``step`` in its lap."""
    B, L = block_rows(layout), layout.lane_capacity
    slot = step % L
    j = slot // B
    return j, step - (slot - j * B), min(B, L - j * B)


@dataclass(frozen=True)
class BlockHead:
    """What a block's header says (rows / lane steps)."""

    store_id: str
    lane: int
    block: int
    first_step: int
    rows: int
    crc32c: int


def encode_block(store_id: str, lane: int, block: int, first_step: int,
                 episode_step: np.ndarray, flags: np.ndarray) -> bytes:
    """A block object holding the metadata of steps ``first_step ..`` (one per row)."""
    payload = (np.ascontiguousarray(episode_step, "<i4").tobytes()
               + np.ascontiguousarray(flags, np.uint8).tobytes())
    head = seal("index_block", SNAPSHOT_VERSION, {
        "store_id": store_id, "lane": int(lane), "block": int(block),
        "first_step": int(first_step), "rows": len(flags),
        "crc32c": crc32c.crc32c(payload)})
    return _LEN.pack(len(head)) + head + payload


def decode_block(raw: bytes, where: str) -> tuple[BlockHead, np.ndarray, np.ndarray]:
    """Header, episode positions and flags of a block (views of ``raw``).
    :class:`StoreCorruptError` naming ``where`` when it is torn or damaged."""
    mv = memoryview(raw)
    if len(mv) < _LEN.size:
        raise StoreCorruptError(f"{where}: index snapshot block is truncated")
    n = _LEN.unpack_from(mv)[0]
    body = unseal(bytes(mv[_LEN.size:_LEN.size + n]), "index_block", SNAPSHOT_VERSION,
                  where, "index snapshot block")
    try:
        head = BlockHead(str(body["store_id"]), int(body["lane"]), int(body["block"]),
                         int(body["first_step"]), int(body["rows"]), int(body["crc32c"]))
    except (KeyError, TypeError, ValueError) as e:
        raise StoreCorruptError(f"{where}: index snapshot block header is not valid "
                                f"({e})") from e
    payload = mv[_LEN.size + n:]
    if len(payload) != ROW_BYTES * head.rows or crc32c.crc32c(payload) != head.crc32c:
        raise StoreCorruptError(f"{where}: index snapshot block fails its checksum")
    ep = np.frombuffer(payload, "<i4", head.rows)
    fl = np.frombuffer(payload, np.uint8, head.rows, 4 * head.rows)
    return head, ep, fl


def fits(head: BlockHead, layout: Layout, lane: int, block: int) -> bool:
    """Whether a block's header belongs where it was found: this store, lane and block,
    and the geometry ``layout`` gives that block."""
    if layout.store_id is None or head.store_id != layout.store_id:
        return False
    B, L = block_rows(layout), layout.lane_capacity
    return (head.lane == lane and head.block == block and head.first_step >= 0
            and head.first_step % L == block * B and head.rows == min(B, L - block * B))


def valid_steps(head: BlockHead, count: int, valid_from: int,
                lane_capacity: int) -> tuple[int, int]:
    """Steps ``[a, b)`` of a block the lane (``count``, ``valid_from``) still holds as the
    block has them (``b <= a``: none): its rows that are committed, not dropped, and not
    overwritten by a later lap."""
    a = max(head.first_step, count - lane_capacity, valid_from)
    return a, min(head.first_step + head.rows, count)


def drop_blocks(backend: Backend, layout: Layout, lane: int, start: int = 0,
                stop: int | None = None) -> None:
    """Delete lane ``lane``'s blocks holding any of steps ``[start, stop)`` in their lap
    (``stop=None``: every block of the lane). For whoever lowers a lane's ``count``
    (an import resumed a row back, ``repair`` rebuilding a lane state): steps at or past
    the new count will be written again, so a block holding their old metadata must go
    before the lane state is written."""
    if stop is None:
        for key in backend.list(lane_prefix(lane)):
            backend.delete(key)
        return
    step = start
    while step < stop:
        j, first, rows = block_of(layout, step)
        backend.delete(block_key(lane, j))
        step = first + rows
