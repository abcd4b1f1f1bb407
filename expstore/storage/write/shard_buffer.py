"""One buffer of a lane's pool: a shard's rows while they are staged, and its record.

A lane writer (``writer.py``) stages rows in a small pool of these. What changes when a
shard fills or opens (its rows, first step, whether it was opened, whether its write
finished) lives in the buffer's **record**, one small int64 array, rather than in Python
attributes: the step kernel (``_step.c``) reads and writes it through its address, so
handing a full shard over and opening the next one inside an ``add`` touch one cache line
per buffer instead of a dozen attribute dictionaries that are cold by then (once in
``shard_rows`` adds). Python code reads and writes the same words through the properties
below.
"""

from __future__ import annotations

import numpy as np

from ..format import ShardImage
from ..native import step_kernel as _step
from .rewrite import Lineage

#: the record's words, in the order ``_step.c`` reads them (``R_N`` .. ``R_ADDRESSES``):
#: rows staged; the shard's first step; 1 once opened for that shard; 1 while ``images``
#: hold nothing; 1 once its background write finished (or was skipped); its buffer of the
#: shared staging file (-1: private memory); then its field buffers' addresses and its
#: published-count word's (0: private), as ``lane_rows.shard_addresses`` gives them
R_N, R_FIRST, R_ENTERED, R_CLEAN, R_DONE, R_SLOT, R_ADDRESSES = range(7)
if _step is not None and getattr(_step, "RECORD", None) != (R_N, R_FIRST, R_ENTERED, R_CLEAN,
                                                          R_DONE, R_SLOT, R_ADDRESSES):
    raise ImportError("expstore.storage.native._step was built from older sources (its shard "
                      "buffer record differs from shard_buffer.py): rebuild it, e.g. "
                      "`python setup.py build_ext --inplace` or `pip install -e .`")


def _count(k: int, doc: str) -> property:
    def get(self: ShardBuffer) -> int:
        return int(self.rec[k])

    def put(self: ShardBuffer, value: int) -> None:
        self.rec[k] = value

    return property(get, put, doc=doc)


def _flag(k: int, doc: str) -> property:
    def get(self: ShardBuffer) -> bool:
        return bool(self.rec[k])

    def put(self: ShardBuffer, value: bool) -> None:
        self.rec[k] = 1 if value else 0

    return property(get, put, doc=doc)


class ShardBuffer:
    """One buffer of the pool: a shard's rows (``staging``: field -> ``shard_rows`` rows),
    its objects as assembled so far (``images``), and its record (``rec``; ``rec_at``: its
    address). ``addresses`` is the record's tail: the field buffers' addresses, then the
    published-count word's."""

    n = _count(R_N, "rows staged")
    first_step = _count(R_FIRST, "the shard's first step")
    entered = _flag(R_ENTERED, "opened for its current shard (``LaneWriter._enter_shard``)")
    clean = _flag(R_CLEAN, "``images`` hold nothing (reset after the shard was written)")
    done = _flag(R_DONE, "its background write finished (or was skipped)")
    slot = _count(R_SLOT, "buffer of the shared staging file, -1: private memory")

    def __init__(self, slot: int, staging: dict[str, np.ndarray],
                 images: dict[str, ShardImage], addresses: np.ndarray) -> None:
        self.rec = np.zeros(R_ADDRESSES + len(addresses), np.int64)
        self.rec[R_ADDRESSES:] = addresses
        self.addresses = self.rec[R_ADDRESSES:]
        self.rec_at = int(self.rec.ctypes.data)  # (fixed: the array is never resized)
        self.slot = slot
        self.done = True
        self.clean = True
        self.staging = staging
        self.images = images
        self.spare_dir: str | None = None  # spare files of its partial flushes (local)
        self.lineages: list[Lineage] = []  # and their open descriptors

    def __repr__(self) -> str:
        return (f"ShardBuffer(slot={self.slot}, first_step={self.first_step}, n={self.n}, "
                f"entered={self.entered}, done={self.done})")
