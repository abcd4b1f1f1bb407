"""Dopamine checkpoints -> a store: :func:`import_dopamine` (a whole run, from a folder or
any fsspec URL, checkpoints decoded in parallel processes, resumable)."""

from __future__ import annotations

import os
import time
from typing import Any

from ...api import create
from ...errors import DatasetFormatError
from ...storage.format import auto_shard_rows, write_import_marker
from ..episodes import capacity_for
from ..lanes import import_lanes, new_marker
from ..progress import ProgressArg
from ..resume import resumable_marker
from ..source import SourceFolder
from ..streaming import check_block_rows
from ..summary import ImportSummary
from .checkpoint import STORE_PREFIX, dopamine_spec, find_suffixes, inspect_checkpoint
from .lane import checkpoint_lane, count_rows

FORMAT = "dopamine"
#: raw bytes of one shard's rows an import's default shard size stays within: each worker's
#: writer stages up to three shards (``storage/write/buffer_pool.py``), so 84x84 frames get
#: 2,048-row shards, 3 x 14.5 MB per worker
IMPORT_SHARD_BYTES = 16 << 20


def import_shard_rows(spec: Any, capacity: int, lanes: int) -> int:
    """Default rows per shard of an import: the store's default (``auto_shard_rows``),
    halved while a shard's rows would exceed :data:`IMPORT_SHARD_BYTES` (64 at least)."""
    import numpy as np

    row = sum(np.dtype(f.dtype).itemsize * int(np.prod(f.shape, dtype=np.int64))
              for f in spec.fields.values())
    rows = auto_shard_rows(capacity, lanes)
    while rows > 64 and rows * row > IMPORT_SHARD_BYTES:
        rows //= 2
    return rows


def parse_suffixes(spec: Any) -> list[int] | None:
    """Checkpoint suffixes from ``None`` (all), an int, a list/range, or a string such as
    ``"0-9,12"`` (ranges include both ends)."""
    if spec is None:
        return None
    if isinstance(spec, bool):
        raise ValueError(f"suffixes: expected checkpoint numbers, got {spec!r}")
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, str):
        out: list[int] = []
        try:
            for part in filter(None, (p.strip() for p in spec.split(","))):
                lo, _, hi = part.partition("-")
                out += list(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(f"suffixes: expected checkpoint numbers like '0-9,12', got "
                             f"{spec!r}") from None
        return out
    return [int(s) for s in spec]


def import_dopamine(src: str | os.PathLike, url: str | os.PathLike,
                    suffixes: list[int] | range | int | str | None = None, *, stack: int = 4,
                    num_actions: int | None = None, codec: dict | None = None,
                    capacity: int | None = None, shard_rows: int | None = None,
                    block_rows: int = 512, workers: int | None = None,
                    overwrite: bool = False, storage_options: dict[str, Any] | None = None,
                    source_options: dict[str, Any] | None = None, fsync: bool = False,
                    progress: ProgressArg = None) -> ImportSummary:
    """Import Dopamine checkpoints from ``src`` (a folder, or any fsspec URL such as
    ``s3://bucket/dqn/Pong/1/replay_logs`` or ``gs://...``) into a store at ``url``.

    ``suffixes``: which checkpoints (default: all found; a list, a range, or ``"0-9,12"``),
    one lane each, in that order. Files are streamed, never copied: a worker holds its
    lane writer's staging (up to three shards of rows), three blocks of ``block_rows``
    frames, the source's read-ahead and the small arrays (action/reward/terminal: 9 bytes
    per row). ``workers``: processes decoding checkpoints in parallel (default: one per
    CPU core, at most one per checkpoint; ``1``: in this process). ``stack``: Dopamine's
    ``stack_size`` (the obs field gets ``stack`` and zero padding). ``codec`` for frames
    (default: the store's image codec). ``source_options``: fsspec options for ``src``
    (``storage_options`` are the store's). ``shard_rows``: default
    :func:`import_shard_rows` (shards of at most 16 MiB of rows).

    The store is marked as a partial import until every checkpoint is in
    (``expstore info``/``verify`` say so). Running the same import again on a partial store
    resumes it: finished checkpoints are skipped, an unfinished one goes on after its last
    committed row, and the store ends with exactly the rows of an uninterrupted import.
    Ctrl-C stops at a block boundary with every row so far committed, then raises
    ``KeyboardInterrupt``.
    """
    t0 = time.perf_counter()
    block_rows = check_block_rows(block_rows)
    folder = SourceFolder(src, source_options)
    if not folder.is_dir():
        raise FileNotFoundError(f"{src}: not a folder of Dopamine checkpoint files")
    chosen = parse_suffixes(suffixes)
    if chosen is None:
        chosen = find_suffixes(folder)
        if not chosen:
            raise FileNotFoundError(f"{src}: no {STORE_PREFIX}observation_ckpt.<N>.gz files")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"suffixes: each checkpoint once, got {chosen}")
    cks = [inspect_checkpoint(folder, s, stack) for s in chosen]
    spec = dopamine_spec(cks[0], stack, num_actions, codec)
    for ck in cks[1:]:
        other = dopamine_spec(ck, stack, num_actions, codec)
        if not other.same_as(spec):
            raise DatasetFormatError(f"{ck.path('observation')}: checkpoint {ck.suffix} holds "
                                     f"other arrays than checkpoint {cks[0].suffix}: "
                                     + "; ".join(spec.diff(other)))
    url = os.fspath(url)
    options = {"suffixes": chosen, "stack": stack, "num_actions": num_actions,
               "codec": codec}
    summary = ImportSummary(str(src), url, lanes=len(cks))
    marker = resumable_marker(url, FORMAT, folder.url, options, storage_options, overwrite)
    if marker is None:
        cap = capacity_for(max(count_rows(ck, stack) for ck in cks), len(cks), capacity)
        if shard_rows is None:
            shard_rows = import_shard_rows(spec, cap, len(cks))
        store = create(url, spec, cap, lanes=len(cks), shard_rows=shard_rows,
                       overwrite=overwrite, storage_options=storage_options, fsync=fsync,
                       mode="r")  # lanes are opened for writing by the workers, one each
        try:
            marker = new_marker(FORMAT, folder.url, options,
                                [{"checkpoint": ck.suffix} for ck in cks])
            write_import_marker(store.backend, marker)
        finally:
            store.close()
            del store
    try:
        import_lanes(url, marker, cks, checkpoint_lane,
                     (url, stack, block_rows, storage_options, fsync), summary,
                     total=lambda lanes: sum(cks[i].n for i in lanes),
                     desc=f"dopamine {folder.name}", workers=workers, progress=progress,
                     storage_options=storage_options, report_rows=8 * block_rows,
                     name=lambda lane: f"checkpoint {cks[lane].suffix}", unit="checkpoint(s)")
    finally:
        summary.seconds = time.perf_counter() - t0
    return summary
