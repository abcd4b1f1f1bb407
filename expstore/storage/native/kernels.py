"""The optional C kernels and their numpy fallbacks.

``native`` is the read side's compiled module (``_kernels.c``), ``write`` the write side's
(``_step.c`` + ``_write.c``); each is ``None`` where it was not built (no C compiler at
install time): everything still works, slower. Tests switch one off by setting it here.
"""

from __future__ import annotations

import os

import numpy as np

try:
    from . import _kernels as native
except ImportError:  # pragma: no cover - exercised where no compiler was available
    native = None
try:
    from . import _step as write
except ImportError:  # pragma: no cover - exercised where no compiler was available
    write = None
try:
    from ._step import copy_bytes as _copy_bytes
    from ._step import same_bytes as _same_bytes
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _same_bytes = _copy_bytes = None


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether C-contiguous arrays ``a`` and ``b`` hold the same bytes (one ``memcmp``
    where the step kernel is built; else through copies)."""
    if _same_bytes is not None and a.flags.c_contiguous and b.flags.c_contiguous:
        return _same_bytes(a, b)
    return a.nbytes == b.nbytes and a.tobytes() == b.tobytes()


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for arrays of one dtype and shape, with one ``memcpy`` that keeps
    the GIL where the step kernel is built: numpy lets it go for copies of this size, and a
    background thread (a shard writer) that takes it then holds up the adding thread."""
    if (_copy_bytes is not None and dst.dtype == src.dtype and dst.shape == src.shape
            and dst.flags.c_contiguous and src.flags.c_contiguous):
        _copy_bytes(dst, src)
    else:
        dst[...] = src


def unique_first(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``keys`` (int64): ``(first, inv)``, ``keys[first]`` each distinct key once
    (``first``: the position of its first appearance) and ``keys == keys[first][inv]``.
    One hashing pass where the C kernels are built (keys in order of appearance), else
    ``np.unique`` (keys sorted)."""
    keys = np.ascontiguousarray(keys, np.int64)
    if native is not None:
        first, inv = np.empty(len(keys), np.int64), np.empty(len(keys), np.int64)
        u = native.first_index(keys, first, inv)
        if u is not None:
            return first[:u], inv
    _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    return first, inv.reshape(-1)


def copy_rows(src: np.ndarray, src_rows: np.ndarray, dst: np.ndarray,
              dst_rows: np.ndarray | None = None) -> None:
    """``dst[dst_rows[i]] = src[src_rows[i]]`` (``dst[i]`` when ``dst_rows`` is None).

    ``src`` and ``dst``: C-contiguous, same row size in bytes (first axis = rows).
    """
    if src.ndim == 1 and dst_rows is None:  # scalars: numpy is quicker than a call here
        np.take(src, src_rows, out=dst)
        return
    src_rows = np.ascontiguousarray(src_rows, np.int64)
    if native is not None and src.flags.c_contiguous and dst.flags.c_contiguous:
        row_bytes = src.nbytes // max(len(src), 1)
        if dst_rows is not None:
            dst_rows = np.ascontiguousarray(dst_rows, np.int64)
        if row_bytes and len(dst) and dst.nbytes // len(dst) == row_bytes:
            native.copy_rows(src, src_rows, dst, dst_rows, row_bytes)
            return
    if dst_rows is None:
        np.take(src, src_rows, axis=0, out=dst)
    else:
        dst[dst_rows] = src[src_rows]


#: environment variable naming the preads ``read_rows`` keeps in flight per call (frames)
READ_DEPTH_ENV = "EXPSTORE_READ_DEPTH"
#: most preads in flight per call the read pool takes (``read_pool.h``)
READ_DEPTH_MAX = 256


def _checked_depth(depth: object, what: str) -> int:
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or not (
            1 <= depth <= READ_DEPTH_MAX):
        raise ValueError(f"{what}: expected an integer from 1 to {READ_DEPTH_MAX} (preads "
                         f"in flight per batch read; 1: one after another), got {depth!r}")
    return int(depth)


def set_read_depth(depth: int) -> int:
    """Preads the frame path keeps in flight per batch read, for this process (1 to 256;
    1 reads one chunk run after another without threads): the previous depth. Where the
    read kernel was not built, nothing changes and 1 is answered."""
    depth = _checked_depth(depth, "read depth")
    return 1 if native is None else int(native.set_read_depth(depth))


def apply_read_depth_env() -> int:
    """Set the depth from ``EXPSTORE_READ_DEPTH`` when it is set (a clear ``ValueError``
    naming it when it is not an integer from 1 to 256); the depth in force."""
    raw = os.environ.get(READ_DEPTH_ENV)
    if raw is not None and raw.strip():
        try:
            depth: object = int(raw)
        except ValueError:
            depth = raw
        set_read_depth(_checked_depth(depth, READ_DEPTH_ENV))
    return 1 if native is None else int(native.read_depth())
