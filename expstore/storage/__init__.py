"""Storage: where bytes live. Backends (local, memory, fsspec, S3 as plug-ins), the zarr v3
layout of a store, the shard format, the writer that stages and commits rows, the reader
that checks every row's step, per-lane state, leases and quarantine, and the priority file
format. Knows rows and bytes; nothing of sampling or priorities' meaning.
"""

from .backends import Backend, backend_for, known_backends, register_backend
from .format import (
    STATE_VERSION,
    LaneState,
    Layout,
    Quarantine,
    auto_shard_rows,
    read_layout,
    read_quarantine,
    read_state,
    read_states,
    round_capacity,
    state_key,
    write_metadata,
    write_quarantine,
    write_state,
)
from .native import copy_rows
from .ownership import (
    DEFAULT_TTL,
    LaneLease,
    LeasedBackend,
    acquire_all,
    lease_key,
    live_holders,
    require_atomic_writes,
)
from .read import ShardReader
from .write import LaneWriter

__all__ = [
    "DEFAULT_TTL",
    "STATE_VERSION",
    "Backend",
    "LaneLease",
    "LaneState",
    "LaneWriter",
    "LeasedBackend",
    "Layout",
    "Quarantine",
    "ShardReader",
    "acquire_all",
    "auto_shard_rows",
    "backend_for",
    "copy_rows",
    "known_backends",
    "lease_key",
    "live_holders",
    "read_layout",
    "read_quarantine",
    "read_state",
    "read_states",
    "register_backend",
    "require_atomic_writes",
    "round_capacity",
    "state_key",
    "write_metadata",
    "write_quarantine",
    "write_state",
]
