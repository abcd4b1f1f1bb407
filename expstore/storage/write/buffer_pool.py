"""How many shard buffers each lane's writer stages in (:class:`~.writer.LaneWriter`)."""

from __future__ import annotations

#: shard buffers of a store's lanes together (bytes): each lane gets its share of this as
#: 3 to ``MAX_BUFFERS`` buffers (small shards: more, so that a burst of adds never waits
#: for storage), or 2 where one shard's buffer (all fields) exceeds it
POOL_BYTES = 64 << 20
MAX_BUFFERS = 16


def pool_size(shard_bytes: int, lanes: int) -> int:
    """Shard buffers per lane for shards of ``shard_bytes`` bytes in a store of ``lanes``."""
    if shard_bytes > POOL_BYTES:
        return 2
    share = POOL_BYTES // max(1, lanes)
    return max(3, min(MAX_BUFFERS, share // max(1, shard_bytes)))
