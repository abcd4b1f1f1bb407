"""Format: what a store is on disk. The zarr v3 layout and metadata, the shard codec, the
lane state file, the quarantine and import marker, the priority file, the index snapshot
blocks, and the per-row metadata rebuilt from the rows around a bad chunk. Pure bytes <->
values; no threads, no ownership.
"""

from .import_marker import (
    describe_import,
    import_is_partial,
    read_import_marker,
    write_import_marker,
)
from .index_snapshot import (
    BlockHead,
    block_key,
    block_of,
    block_rows,
    blocks_per_lane,
    decode_block,
    drop_blocks,
    encode_block,
    fits,
    lane_prefix,
    valid_steps,
)
from .layout import (
    META_ROW_BYTES,
    SCALAR_CHUNK_ROWS,
    VECTOR_CHUNK_BYTES,
    Layout,
    auto_shard_rows,
    read_layout,
    round_capacity,
    stored_row_bytes,
    vector_chunk_rows,
    write_metadata,
)
from .metadata_rebuild import DERIVED, derive_step_ids, lost_ranges, read_metadata, rewrite_chunks
from .priority_file import decode as decode_priorities
from .priority_file import encode as encode_priorities
from .priority_file import priority_key
from .quarantine import Quarantine, read_quarantine, write_quarantine
from .shard import (
    EMPTY,
    HEADER_SIZE,
    ShardHead,
    ShardImage,
    decoder,
    encoder,
    index_size,
    parse_head,
    rows_encoder,
)
from .state import STATE_VERSION, LaneState, read_state, read_states, state_key, write_state
from .zarr_meta import (
    ROOT_KEY,
    check_arrays,
    expected_metadata,
    layout_from_arrays,
    with_store_id,
)

__all__ = [
    "BlockHead", "block_key", "block_of", "block_rows", "blocks_per_lane", "decode_block",
    "drop_blocks", "encode_block", "fits", "lane_prefix", "valid_steps",
    "DERIVED", "EMPTY", "HEADER_SIZE", "LaneState", "Layout", "Quarantine", "ROOT_KEY",
    "META_ROW_BYTES", "STATE_VERSION", "ShardHead", "ShardImage", "SCALAR_CHUNK_ROWS",
    "VECTOR_CHUNK_BYTES",
    "auto_shard_rows", "stored_row_bytes",
    "check_arrays", "vector_chunk_rows",
    "decode_priorities", "decoder", "derive_step_ids", "describe_import", "encode_priorities",
    "encoder", "expected_metadata", "import_is_partial", "index_size", "layout_from_arrays",
    "lost_ranges", "parse_head", "priority_key", "read_import_marker", "read_layout",
    "read_metadata", "read_quarantine", "read_state", "read_states", "rewrite_chunks",
    "round_capacity", "rows_encoder", "state_key", "write_import_marker", "write_metadata",
    "with_store_id", "write_quarantine", "write_state",
]
