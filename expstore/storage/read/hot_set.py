"""The hot set: a reader's decoded small fields, and a batch gathered out of it at once.

Fields stored many rows per chunk (scalars, state vectors: everything but frames) keep
decoded shards in their :class:`~expstore.storage.read.shard_table.ShardTable` value slots,
within the field's part of the store's ``hot_bytes`` (``kernel_budget.split_value_bytes``:
where not all fit, the fields of fewest bytes per row read are decoded first). Slots are
taken as shards are first read and never given to another shard: where the budget holds
every shard, each field is an in-RAM ring of its decoded rows; where it does not, the
shards read first stay and rows of the others are read from their shards (only the blosc
blocks holding them decoded), so a store past the budget costs per row missed, with no
churn. A slot is keyed by the shard version it holds (first lane step, rows, the
committed count it is trusted for): a row a lap rewrote never comes from it.

:func:`gather_held` serves every small field of a batch from there in one kernel call,
straight into the batch's arrays, without the GIL. A scalar held as codes
(``scalar_codes.py``) is decoded there, each row's code looked up in its field's book.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..native import native
from .joint_codes import JointCodes


def gather_held(reader: Any, locs: list[tuple[np.ndarray, ...]],
                jobs: list[tuple[int, str, np.ndarray]], copy: bool = True,
                staged: dict[str, tuple[tuple, np.ndarray]] | None = None) -> bool:
    """For each job ``(loc, name, out)``, field ``name`` of ``reader`` (a
    ``ShardReader``) at the rows and lane steps of ``locs[loc]`` (int64 arrays; a third
    array, bool, marks rows to skip: neither checked nor written) into ``out``
    (C-contiguous, one entry per row). True when every row not skipped, of every job, is
    held decoded by a trusted version (and, with ``copy``, is written; the reader's known
    committed counts are raised to the steps read); False, nothing written, otherwise
    (read them with ``read_fields``, which fills the hot set). ``copy=False``: only the
    check. ``staged``: field -> (per lane, its rows a writer of this process staged, or
    ``None``; per lane, the step of their first), and the skipped rows are written from
    there (False where one is not staged there). Needs the kernel (else False)."""
    if staged is not None and native is None:
        return False
    tables = reader.tables
    sizes = [len(x[0]) if len(x) == 2 else len(x[0]) - int(x[2].sum()) for x in locs]
    args = []
    n = 0  # rows served
    for loc, name, out in jobs:
        t = tables.get(name)
        if t is None or t.per_row or not len(t.values):
            return False
        code = None if t.code is None else (t.code.bits, t.code.table)
        args.append((loc, t.first, t.n_rows, t.trusted, t.slot, t.values, out, code)
                    if staged is None else
                    (loc, t.first, t.n_rows, t.trusted, t.slot, t.values, out, code,
                     *staged[name]))
        n += sizes[loc]
    layout = reader.layout
    S = layout.shard_rows
    if native is not None:
        joint = reader.joint_for([name for _, name, _ in jobs]) if copy else None
        served = joint is not None and _gather_joint(reader, joint, locs, jobs, args)
        if not served and not native.gather_held(S, layout.shards_per_lane, reader.known,
                                                 tuple(locs), tuple(args), copy):
            return False
    elif not _gather_numpy(reader, locs, jobs, copy):
        return False
    if copy:
        reader.stats.chunk_cache_hits += n
        reader.stats.rows += n
    return True


def _gather_joint(reader: Any, joint: JointCodes, locs: list[tuple[np.ndarray, ...]],
                  jobs: list[tuple[int, str, np.ndarray]], args: list[tuple]) -> bool:
    """The kernel call with the jobs of the joint codes' fields read from them
    (``joint_codes.py``); the batch's shards they do not hold yet are copied first where
    the fields hold them. False, nothing written, where a row is still not held."""
    layout = reader.layout
    args = tuple(joint.job(a, name) if name in joint.tables else a
                 for a, (_, name, _) in zip(args, jobs))
    for attempt in (0, 1):
        if native.gather_held(layout.shard_rows, layout.shards_per_lane, reader.known,
                              tuple(locs), args, True):
            joint.served += 1
            return True
        if attempt or joint.off or not joint.build_for(locs):
            return False  # (nothing new copied: the same call would fail again)
    return False


def _gather_numpy(reader: Any, locs: list[tuple[np.ndarray, ...]],
                  jobs: list[tuple[int, str, np.ndarray]], copy: bool) -> bool:
    """:func:`gather_held` without the kernel (the same checks and results)."""
    S = reader.layout.shard_rows
    tables = reader.tables
    where = []
    for loc in locs:
        rows, steps = loc[0], loc[1]
        take = np.flatnonzero(~loc[2]) if len(loc) > 2 else slice(None)
        shards = rows[take] // S
        where.append((take, shards, rows[take] - shards * S, steps[take]))
    for loc, name, _ in jobs:
        _, shards, slots, steps = where[loc]
        if len(shards) and not tables[name].ready(shards, slots, steps).all():
            return False
    if copy:
        for loc, name, out in jobs:
            take, shards, slots, _ = where[loc]
            out[take] = tables[name].take(shards, slots)
        for _, shards, _, steps in where:
            if len(shards):
                reader._bump(shards, steps)
    return True
