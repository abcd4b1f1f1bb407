"""One checkpoint -> one lane: :func:`import_lane` (frames streamed in blocks, resumable).

A checkpoint maps to a lane deterministically: chronological row ``q`` is padding or not
(terminals and the leading zero rows decide), and each kept row becomes one store row, two
when it is a terminal (its step and the episode's final row). So the rows a lane already
committed (an interrupted import) say exactly which source row comes next:
:func:`~expstore.datasets.resume.resume_point`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ...api import open as open_store
from ...errors import DatasetFormatError
from ...storage.backends import backend_for
from ...storage.format import read_state
from ..lanes import LaneResult
from ..resume import episode_position, resume_point, rewind_lane
from ..streaming import Prefetch, blocks
from .checkpoint import CORE, Checkpoint

_SMALL_ROW = 256  # arrays with rows up to this many bytes are loaded whole (C x 256 B)
#: blocks inflated ahead of the one being stored: the writer's encoding is the slower
#: stage, so one hides the inflate and each further block only costs memory
_PREFETCH = 1


def load_small(ck: Checkpoint) -> dict[str, np.ndarray]:
    """Whole small arrays (action, reward, terminal, small extras), oldest row first."""
    out = {}
    for name, (shape, dtype) in ck.arrays.items():
        row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        if name != "observation" and row <= _SMALL_ROW:
            with ck.reader(name) as r:
                out[name] = ck.chrono(r.read_all())
    return out


def padding(ck: Checkpoint, small: dict[str, np.ndarray], stack: int) -> tuple[np.ndarray, int]:
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


def count_rows(ck: Checkpoint, stack: int) -> int:
    """Upper bound of the store rows a checkpoint becomes (steps + final rows)."""
    small = load_small(ck)
    pad, _ = padding(ck, small, stack)
    return int((~pad).sum()) + int(((small["terminal"] != 0) & ~pad).sum())


def _stream(ck: Checkpoint, names: list[str], block_rows: int) -> Iterator[dict]:
    """Blocks of the streamed arrays, oldest rows first: ``{name: (b-a, ...) array}``.

    Blocks are inflated into a ring of ``_PREFETCH + 2`` buffers (one being filled, the
    prefetched ones, the one the consumer holds), so a block is valid until the consumer
    asks for the next one but one: reading allocates nothing per block, which keeps the
    heap of a long import from growing with freed blocks.
    """
    readers = {name: ck.reader(name) for name in names}
    ring = [{name: np.empty((block_rows, *ck.arrays[name][0][1:]), ck.arrays[name][1])
             for name in names} for _ in range(_PREFETCH + 2)]
    k = 0
    try:
        for fa, fb in ck.file_ranges():
            for name, r in list(readers.items()):
                if r.pos > fa:  # second range of a wrapped buffer: start over
                    r.close()
                    readers[name] = r = ck.reader(name)
                r.skip(fa - r.pos, block_rows)
            for a, b in blocks(fa, fb, block_rows):
                vals = {name: r.read(b - a, out=ring[k][name]) for name, r in readers.items()}
                k = (k + 1) % len(ring)
                if b == ck.capacity:
                    for r in readers.values():
                        r.check_end()
                yield vals
    finally:
        for r in readers.values():
            r.close()


def import_lane(ck: Checkpoint, url: str, lane: int, stack: int, block_rows: int, *,
                storage_options: Any = None, fsync: bool = False,
                report: Callable[[int, int], None] = lambda rows, nbytes: None,
                stop: threading.Event | Any = None) -> LaneResult:
    """Stream checkpoint ``ck`` into ``lane`` of the store at ``url`` (padding dropped).

    Rows the lane already holds (an interrupted import of the same checkpoint) are
    skipped: the import goes on where it stopped. ``report(rows, bytes)`` is called per
    block of source rows; ``stop.is_set()`` (checked per block) ends early with every row
    so far committed.
    """
    res = LaneResult(lane)
    if ck.n == 0:
        return res
    small = load_small(ck)
    pad, lead = padding(ck, small, stack)
    term_all = small["terminal"] != 0
    big = [name for name in ck.arrays if name not in small]
    obs_shape, obs_dtype = ck.arrays["observation"]
    zeros = np.zeros((block_rows, *obs_shape[1:]), obs_dtype)  # lazily paged: stays free
    row_bytes = sum(int(np.prod(s[1:], dtype=np.int64)) * d.itemsize
                    for s, d in ck.arrays.values())
    store = None
    q_from = 0
    q = 0  # chronological index of the next row
    try:
        with Prefetch(_stream(ck, big, block_rows), depth=_PREFETCH) as stream:
            for vals in stream:
                n = len(vals["observation"])
                qa, qb = q, q + n
                if qa == 0:
                    # leading zero rows are padding: a new episode follows; otherwise the
                    # oldest rows continue an episode whose start is gone
                    lead = _leading_zero(vals, lead)
                    pad[:lead] = True
                    keep_all = ~pad
                    store, q_from, res.resumed_rows = _open_lane(
                        url, lane, keep_all, term_all, storage_options, fsync)
                    store.set_episode_position(lane, episode_position(
                        keep_all, term_all, q_from, stack - 1 if lead == 0 else 0))
                    if q_from >= ck.n:  # every row is there already
                        report(ck.n, ck.n * row_bytes)
                        break
                p = pad[qa:qb]
                if qb > q_from:
                    _check_padding(ck, vals, p, qa)
                    keep = ~p
                    keep[: max(0, q_from - qa)] = False
                    _write_block(store, lane, vals, small, keep, term_all[qa:qb], qa, qb,
                                 zeros, res)
                q = qb
                report(n, n * row_bytes)
                res.bytes_in += n * row_bytes
                if stop is not None and stop.is_set() and q < ck.n:
                    res.stopped = True
                    break
    finally:
        if store is not None:
            store.close()
    return res


def checkpoint_lane(lane: int, ck: Checkpoint, url: str, stack: int, block_rows: int,
                    storage_options: Any, fsync: bool, *, report: Callable[[int, int], None],
                    stop: Any) -> LaneResult:
    """:func:`import_lane` in the call form of :func:`expstore.datasets.lanes.run_lanes`."""
    return import_lane(ck, url, lane, stack, block_rows, storage_options=storage_options,
                       fsync=fsync, report=report, stop=stop)


def _open_lane(url: str, lane: int, keep: np.ndarray, term: np.ndarray, storage_options: Any,
               fsync: bool) -> tuple[Any, int, int]:
    """Open ``lane`` for writing where its rows stop: ``(store, next source row, rows held)``."""
    backend = backend_for(url, storage_options, fsync=False)
    try:
        committed = read_state(backend, lane).count
    finally:
        backend.close()
    q_from, rows = resume_point(keep, term, committed)
    if rows < committed:
        rewind_lane(url, lane, rows, storage_options)
    store = open_store(url, "r+", lane=lane, storage_options=storage_options, fsync=fsync,
                       index_all=False)  # the lanes of other checkpoints: not needed here
    return store, q_from, rows


def _write_block(store: Any, lane: int, vals: dict[str, np.ndarray],
                 small: dict[str, np.ndarray], keep: np.ndarray, term: np.ndarray, qa: int,
                 qb: int, zeros: np.ndarray, res: LaneResult) -> None:
    T = int(keep.sum())
    if not T:
        return
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
    res.steps += T
    res.episodes += ends
    res.rows += T + ends


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
