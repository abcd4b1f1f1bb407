"""Dopamine checkpoints -> a new store: :func:`import_dopamine` (frames streamed in blocks)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DatasetFormatError
from ...store import create
from ...store import open as open_store
from ..episodes import capacity_for
from ..npy_gzip import NpyGzipReader, load_gz
from ..progress import Progress, ProgressArg, interruptible
from ..streaming import Prefetch, blocks
from ..summary import ImportSummary
from .checkpoint import (
    CORE,
    STORE_PREFIX,
    Checkpoint,
    dopamine_spec,
    find_suffixes,
    inspect_checkpoint,
)

_SMALL_ROW = 256  # arrays with rows up to this many bytes are loaded whole (C x 256 B)


def _load_small(ck: Checkpoint) -> dict[str, np.ndarray]:
    """Whole small arrays (action, reward, terminal, small extras), oldest row first."""
    out = {}
    for name, (shape, dtype) in ck.arrays.items():
        row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        if name != "observation" and row <= _SMALL_ROW:
            out[name] = ck.chrono(load_gz(ck.path(name)))
    return out


def _padding(ck: Checkpoint, small: dict[str, np.ndarray], stack: int) -> tuple[np.ndarray, int]:
    """Padding mask from terminals (oldest first) and how many leading rows may be padding.

    Dopamine pads ``stack - 1`` zero rows after every terminal; a non-zero value there
    means the checkpoint was written with another ``stack_size``.
    """
    term = small["terminal"]
    n = len(term)
    pad = np.zeros(n, bool)
    ends = np.flatnonzero(term != 0)
    for k in range(1, stack):
        idx = ends + k
        pad[idx[idx < n]] = True
    pad &= term == 0  # a terminal right after a terminal would be a 1-step episode: keep
    for name, arr in small.items():
        flat = arr.reshape(n, -1)
        bad = np.flatnonzero(pad & (flat != 0).any(axis=1))
        if len(bad):
            j = int(bad[0])
            raise DatasetFormatError(
                f"{ck.path(name)}: row {(ck.start + j) % ck.capacity} should be padding "
                f"(Dopamine writes stack_size-1 = {stack - 1} zero rows after each terminal) "
                f"but holds {flat[j].tolist()}; was the buffer written with another "
                "stack_size? (pass stack=...)")
    zero = np.ones(n, bool)
    for arr in small.values():
        zero &= ~(arr.reshape(n, -1) != 0).any(axis=1)
    lead = 0
    while lead < min(stack - 1, n) and zero[lead] and not pad[lead]:
        lead += 1
    return pad, lead


def _count_rows(ck: Checkpoint, stack: int) -> tuple[int, int]:
    """Upper bound of store rows for a checkpoint and its episode count."""
    small = _load_small(ck)
    pad, _ = _padding(ck, small, stack)
    steps = int((~pad).sum())
    episodes = int(((small["terminal"] != 0) & ~pad).sum())
    return steps + episodes, episodes


def import_dopamine(src: str | os.PathLike, url: str | os.PathLike,
                    suffixes: list[int] | int | None = None, *, stack: int = 4,
                    num_actions: int | None = None, codec: dict | None = None,
                    capacity: int | None = None, shard_rows: int | None = None,
                    block_rows: int = 1024, overwrite: bool = False,
                    storage_options: dict[str, Any] | None = None, fsync: bool = False,
                    progress: ProgressArg = None) -> ImportSummary:
    """Import Dopamine checkpoint(s) from folder ``src`` into a new store at ``url``.

    ``suffixes``: which checkpoints (default: all found), one lane each, in that order.
    ``stack``: Dopamine's ``stack_size`` (the store's obs field gets ``stack`` and
    zero padding). ``codec`` for frames (default: the store's image codec). Frames are
    streamed ``block_rows`` at a time; memory stays near one block plus the small arrays
    (action/reward/terminal: 9 bytes per row). Ctrl-C stops at a block boundary with every
    row so far flushed, then raises ``KeyboardInterrupt``.
    """
    t0 = time.perf_counter()
    src = Path(src)
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: not a folder of Dopamine checkpoint files")
    if suffixes is None:
        suffixes = find_suffixes(src)
        if not suffixes:
            raise FileNotFoundError(f"{src}: no {STORE_PREFIX}observation_ckpt.<N>.gz files")
    elif isinstance(suffixes, int):
        suffixes = [suffixes]
    cks = [inspect_checkpoint(src, s, stack) for s in suffixes]
    spec = dopamine_spec(cks[0], stack, num_actions, codec)
    for ck in cks[1:]:
        other = dopamine_spec(ck, stack, num_actions, codec)
        if not other.same_as(spec):
            raise DatasetFormatError(f"{ck.path('observation')}: checkpoint {ck.suffix} holds "
                                     f"other arrays than checkpoint {cks[0].suffix}: "
                                     + "; ".join(spec.diff(other)))
    need = [_count_rows(ck, stack)[0] for ck in cks]
    cap = capacity_for(max(need), len(cks), capacity)
    summary = ImportSummary(str(src), str(url), lanes=len(cks))
    store = create(url, spec, cap, lanes=len(cks), shard_rows=shard_rows, overwrite=overwrite,
                   storage_options=storage_options, fsync=fsync)
    prog = Progress(sum(ck.n for ck in cks), f"dopamine {src.name}", progress)
    try:
        with interruptible() as intr:
            for lane, ck in enumerate(cks):
                if lane:
                    store = _reopen(store, url, lane, storage_options, fsync)
                _import_lane(store, lane, ck, stack, block_rows, prog, intr, summary)
    finally:
        prog.close()
        store.close()
        summary.seconds = time.perf_counter() - t0
    return summary


def _reopen(store: Any, url: Any, lane: int, storage_options: Any, fsync: bool) -> Any:
    store.close()
    return open_store(url, "r+", lane=lane, storage_options=storage_options, fsync=fsync)


def _stream(ck: Checkpoint, names: list[str], block_rows: int) -> Iterator[dict]:
    """Blocks of the streamed arrays, oldest rows first: ``{name: (b-a, ...) array}``."""
    readers = {name: NpyGzipReader(ck.path(name)) for name in names}
    try:
        for fa, fb in ck.file_ranges():
            for name, r in list(readers.items()):
                if r.pos > fa:  # second range of a wrapped buffer: start over
                    r.close()
                    readers[name] = r = NpyGzipReader(ck.path(name))
                r.skip(fa - r.pos)
            for a, b in blocks(fa, fb, block_rows):
                vals = {name: r.read(b - a) for name, r in readers.items()}
                if b == ck.capacity:
                    for r in readers.values():
                        r.check_end()
                yield vals
    finally:
        for r in readers.values():
            r.close()


def _import_lane(store: Any, lane: int, ck: Checkpoint, stack: int, block_rows: int,
                 prog: Progress, intr: Any, summary: ImportSummary) -> None:
    """Stream one checkpoint into ``lane`` (rows oldest first, padding dropped)."""
    if ck.n == 0:
        return
    small = _load_small(ck)
    pad, lead = _padding(ck, small, stack)
    big = [name for name in ck.arrays if name not in small]
    obs_shape, obs_dtype = ck.arrays["observation"]
    zeros = np.zeros((block_rows, *obs_shape[1:]), obs_dtype)  # lazily paged: stays free
    row_bytes = sum(int(np.prod(s[1:], dtype=np.int64)) * d.itemsize
                    for s, d in ck.arrays.values())
    q = 0  # chronological index of the next row
    with Prefetch(_stream(ck, big, block_rows)) as stream:
        for vals in stream:
            n = len(vals["observation"])
            qa, qb = q, q + n
            p = pad[qa:qb].copy()
            if qa == 0:
                # leading zero rows are padding: a new episode follows; otherwise the
                # oldest rows continue an episode whose start is gone
                lead = _leading_zero(vals, lead)
                p[:lead] = True
                store.set_episode_position(lane, stack - 1 if lead == 0 else 0)
            _check_padding(ck, vals, p, qa)
            keep = ~p
            term = small["terminal"][qa:qb] != 0
            T = int(keep.sum())
            if T:
                batch = {CORE.get(k, k): (v if keep.all() else v[keep]) for k, v in vals.items()}
                for k, v in small.items():
                    if k != "terminal":
                        batch[CORE.get(k, k)] = v[qa:qb][keep]
                batch["terminated"] = done = term[keep]
                batch["truncated"] = np.zeros(T, bool)
                if done.any():
                    batch["next_obs"] = zeros[:T]
                store.extend(batch, lane=lane, check_next_obs=False)
                ends = int(done.sum())
                summary.steps += T
                summary.episodes += ends
                summary.rows += T + ends
            q = qb
            prog.update(n, n * row_bytes)
            summary.bytes_in += n * row_bytes
            intr.check()


def _leading_zero(vals: dict[str, np.ndarray], lead: int) -> int:
    """How many of the first ``lead`` rows are all zero in the streamed arrays too."""
    k = 0
    while k < min(lead, len(next(iter(vals.values())))) and not any(
            v[k].any() for v in vals.values()):
        k += 1
    return k


def _check_padding(ck: Checkpoint, vals: dict[str, np.ndarray], pad: np.ndarray,
                   q0: int) -> None:
    """Rows taken as padding must be all zero in the streamed arrays too."""
    at = np.flatnonzero(pad)
    if not len(at):
        return
    for name, v in vals.items():
        bad = np.flatnonzero(v[at].reshape(len(at), -1).any(axis=1))
        if len(bad):
            row = (ck.start + q0 + int(at[bad[0]])) % ck.capacity
            raise DatasetFormatError(
                f"{ck.path(name)}: row {row} should be zero padding (Dopamine writes "
                "stack_size-1 zero rows after each terminal) but is not; was the buffer "
                "written with another stack_size? (pass stack=...)")
