"""Read: rows back from storage. The shard reader (its batch kernel path and the general
path), its caches and descriptor budget, and the rows other processes staged and did not
flush yet.
"""

from .reader import ShardReader
from .staged import StagedRows, shared_root

__all__ = ["ShardReader", "StagedRows", "shared_root"]
