"""The counters a :class:`~expstore.storage.read.reader.ShardReader` keeps (rows, chunks,
bytes, requests, cache hits and misses, re-opened and stale versions): ``reader.stats``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReadStats:
    """Counters of one reader (rows, bytes, seconds)."""

    rows: int = 0
    chunks: int = 0
    bytes: int = 0
    requests: int = 0
    chunk_cache_hits: int = 0
    chunk_cache_misses: int = 0
    row_cache_hits: int = 0
    row_cache_misses: int = 0
    row_cache_bypassed: int = 0  # reads that passed a frame cache by (its hit rate low)
    reopened: int = 0
    stale: int = 0
    extra: dict = field(default_factory=dict)
