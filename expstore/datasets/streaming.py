"""Streaming rows in blocks: :func:`blocks` (row ranges) and :class:`Prefetch` (reading
ahead in a background thread; defined in ``loading/prefetch.py``, which make_loader's
prefetch thread runs on too)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..loading.prefetch import Prefetch

__all__ = ["Prefetch", "blocks", "check_block_rows"]


def check_block_rows(block_rows: Any) -> int:
    """``block_rows`` as an int >= 1, or a ``ValueError`` naming it (never a silent empty
    import, nor ``range()``'s own message)."""
    if isinstance(block_rows, bool) or not isinstance(block_rows, (int, np.integer)) \
            or block_rows < 1:
        raise ValueError(f"block_rows: expected an int >= 1 (rows read and written at a "
                         f"time), got {block_rows!r}")
    return int(block_rows)


def blocks(start: int, stop: int, size: int) -> Iterator[tuple[int, int]]:
    """``[a, b)`` pieces of ``[start, stop)`` of at most ``size`` (>= 1)."""
    for a in range(start, stop, check_block_rows(size)):
        yield a, min(a + size, stop)
