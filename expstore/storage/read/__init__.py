"""Read: rows back from storage. The shard reader (its batch kernel path and the general
path), its caches and descriptor budget, and the rows other processes staged and did not
flush yet; the index snapshot's blocks a lane load can use.
"""

from .fd_table import ENTRY_TABLE_BYTES, MAP_BYTES
from .reader import ShardReader
from .snapshot import SnapshotRanges
from .staged import StagedRows, shared_root

__all__ = ["ENTRY_TABLE_BYTES", "MAP_BYTES", "ShardReader", "SnapshotRanges", "StagedRows",
           "shared_root"]
