"""Offline integrity check of a store: every shard of every field, every committed row.

:func:`verify_store` needs no working :class:`~expstore.store.Store` (a store whose index
cannot load is exactly what it diagnoses). Per lane it reads the lane state, then every
shard object that should hold committed rows: the shard index (crc32c), the header
(``first_step``/``n_rows`` against the steps the state commits), every inner chunk (decoded),
and the per-row metadata: ``_step_id`` equal to the row's lane step, episode positions and
flags forming valid episodes, ``terminated``/``truncated`` agreeing with the flags.
Before the rows, every array's ``zarr.json`` is checked to be one plain zarr reads as the
array the layout describes. Problems are collected (never raised) so one bad shard does
not hide the others.
``VerifyReport.lost`` gives, per lane, the step ranges whose bytes are bad (an inner chunk:
its rows; a shard's index or header: all its rows), which :func:`repair_store` quarantines.
Rows already quarantined are not read again and do not count as problems.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ExpstoreError, StoreNotFoundError, error_detail
from .rows import FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED
from .storage.backends import backend_for
from .storage.format import (
    DERIVED,
    EMPTY,
    HEADER_SIZE,
    Layout,
    Quarantine,
    check_arrays,
    describe_import,
    import_is_partial,
    index_size,
    lost_ranges,
    parse_head,
    read_import_marker,
    read_layout,
    read_metadata,
    read_quarantine,
    read_state,
    state_key,
)
from .storage.read import ShardReader


@dataclass
class VerifyReport:
    """Result of :func:`verify_store`: ``problems`` is empty for a healthy store."""

    url: str
    lanes: int = 0
    rows: int = 0  # committed rows checked
    shards: int = 0  # shard objects read
    bytes: int = 0  # bytes read
    problems: list[str] = field(default_factory=list)
    #: per lane, sorted ``(start, stop)`` lane-step ranges of rows found bad (not yet
    #: quarantined); lanes whose state file could not be read are in ``problems`` only
    lost: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    quarantined: int = 0  # committed rows already quarantined (lost earlier), not read
    #: per lane, ``(field, shard, first_step)`` of metadata shards with a chunk that fails
    #: its checks but whose values follow from the rows around it (``storage/
    #: metadata_rebuild.py``): their rows are not in ``lost``; ``repair`` rewrites the chunk
    rebuildable: dict[int, list[tuple[str, int, int]]] = field(default_factory=dict)
    #: with ``recheck_quarantined``: per lane, ``(start, stop)`` ranges of quarantined
    #: rows that were read again and found intact (``repair`` releases them)
    intact_quarantined: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    #: one line when a dataset import into the store did not finish (rows are intact but
    #: the dataset is not all there; re-running the import resumes it), else ``None``
    partial_import: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_store(url: str, storage_options: dict[str, Any] | None = None,
                 progress: Callable[[int], None] | None = None,
                 lanes: list[int] | None = None,
                 total: Callable[[int], None] | None = None,
                 recheck_quarantined: bool = False) -> VerifyReport:
    """Check every committed row of the store at ``url`` (of ``lanes``, default all);
    ``total(rows)`` once with the rows to check, then ``progress(rows)`` per shard.
    ``recheck_quarantined``: read quarantined rows too, and list those found intact in
    ``intact_quarantined`` (they are not problems either way)."""
    backend = backend_for(url, storage_options, fsync=False)
    rep = VerifyReport(backend.url)
    try:
        layout = read_layout(backend)
    except StoreNotFoundError:  # nothing to verify: an error, not a problem of a store
        backend.close()
        raise
    except (ExpstoreError, OSError, ValueError) as e:
        rep.problems.append(f"{backend.url}/zarr.json: {error_detail(e)}")
        return rep
    rep.lanes = layout.lanes
    rep.problems += [p for _, p in check_arrays(backend, layout)]
    marker = read_import_marker(backend)
    if import_is_partial(marker):
        rep.partial_import = describe_import(marker)
    try:
        quarantine = read_quarantine(backend)
    except (ExpstoreError, OSError) as e:
        rep.problems.append(error_detail(e))
        quarantine = Quarantine()
    states = {}
    for lane in range(layout.lanes) if lanes is None else lanes:
        try:
            states[lane] = read_state(backend, lane)
        except (ExpstoreError, OSError, ValueError) as e:
            rep.problems.append(f"{backend.url}/{state_key(lane)}: {error_detail(e)}")
    if total is not None:
        total(sum(max(0, st.count - max(st.valid_from, st.count - layout.lane_capacity))
                  for st in states.values()))
    for lane, st in states.items():
        _verify_lane(backend, layout, lane, st, rep, progress, quarantine)
        if recheck_quarantined:
            _recheck_quarantined(backend, layout, lane, st, rep, quarantine)
    backend.close()
    return rep


def _verify_lane(backend: Any, layout: Layout, lane: int, st: Any, rep: VerifyReport,
                 progress: Callable[[int], None] | None,
                 quarantine: Quarantine | None = None,
                 known: np.ndarray | None = None) -> None:
    """Check ``lane``'s committed rows into ``rep``. Rows ``quarantine`` holds are skipped
    (not read where a whole chunk is); ``known``: a mask over the lane's committed steps
    to skip instead."""
    S, Lc = layout.shard_rows, layout.lane_capacity
    lo = max(st.valid_from, st.count - Lc)
    if st.count <= lo:
        return
    n = st.count - lo
    meta = {name: np.zeros(n, layout.fields[name].dtype) for name in
            ("_step_id", "_episode_step", "_flags", "terminated", "truncated")}
    if known is None:
        known = (quarantine or Quarantine()).mask(lane, np.arange(lo, st.count))
    rep.quarantined += int(known.sum())
    good = ~known
    meta_bad = {name: np.zeros(n, bool) for name in DERIVED}
    for fs in range(lo - lo % S, st.count, S):
        shard = lane * layout.shards_per_lane + (fs % Lc) // S
        a, b = max(lo, fs), min(st.count, fs + S)  # committed steps in this shard
        skip = known[a - lo : b - lo]
        if skip.all():
            if progress is not None:
                progress(b - a)
            continue
        for name in layout.fields:
            res = _check_shard(backend, layout, name, shard, fs, a - fs, b - fs, rep, skip)
            if res is None:
                good[a - lo : b - lo] = False
            else:
                vals, bad = res
                if name in DERIVED and bad.any():  # rebuilt from the rows around it
                    meta_bad[name][a - lo : b - lo] |= bad
                    rep.rebuildable.setdefault(lane, []).append((name, shard, fs))
                else:
                    good[a - lo : b - lo] &= ~bad
                if name in meta:
                    meta[name][a - lo : b - lo] = vals
        rep.rows += int((~skip).sum())
        if progress is not None:
            progress(b - a)
    if any(m.any() for m in meta_bad.values()):
        _derive_metadata(backend, layout, lane, lo, st.count, meta, meta_bad, good)
    flagged = np.zeros(n, bool)
    _check_rows(backend.url, layout, lane, lo, st, meta, good, rep, flagged)
    bad = ~(good & ~flagged) & ~known
    if bad.any():  # runs of bad steps
        rep.lost[lane] = lost_ranges(np.arange(lo, st.count), bad)


def _recheck_quarantined(backend: Any, layout: Layout, lane: int, st: Any,
                         rep: VerifyReport, quarantine: Quarantine) -> None:
    """Read ``lane``'s quarantined rows again, every check as for the others: those found
    intact go to ``rep.intact_quarantined`` (the others stay known, not problems). Only
    the shards holding them and the shard on each side are read (the checks of a row
    against the one before reach across a shard's edge), where the whole lane was read a
    second time; their reads count in ``rep.shards`` and ``rep.bytes``."""
    lo = max(st.valid_from, st.count - layout.lane_capacity)
    steps = np.arange(lo, max(lo, st.count))
    held = quarantine.mask(lane, steps)
    if not held.any():
        return
    shard = steps // layout.shard_rows  # (by lane step: a lap's shards count apart)
    near = np.unique(shard[held])
    near = np.union1d(near, np.concatenate([near - 1, near + 1]))
    scratch = VerifyReport(rep.url)
    _verify_lane(backend, layout, lane, st, scratch, None, known=~np.isin(shard, near))
    rep.shards += scratch.shards
    rep.bytes += scratch.bytes
    found_bad = Quarantine({lane: scratch.lost.get(lane, [])}).mask(lane, steps)
    intact = held & ~found_bad
    if intact.any():
        rep.intact_quarantined[lane] = lost_ranges(steps, intact)


def _derive_metadata(backend: Any, layout: Layout, lane: int, lo: int, hi: int,
                     meta: dict[str, np.ndarray], meta_bad: dict[str, np.ndarray],
                     good: np.ndarray) -> None:
    """Fill ``meta`` where a metadata chunk is bad with the values derived from the rows
    around it; rows nothing can rebuild are cleared in ``good`` (lost)."""
    steps = np.arange(lo, hi, dtype=np.int64)
    ids = meta_bad["_step_id"]
    meta["_step_id"][ids] = steps[ids]  # the header's first_step + slot (checked above)
    todo = (meta_bad["_episode_step"] | meta_bad["_flags"]) & good
    if not todo.any():
        return
    reader = ShardReader(backend, layout)
    try:
        for a, b in lost_ranges(steps, todo):
            sel = slice(a - lo, b - lo)
            rows = layout.lane_rows(lane, steps[sel])
            m = read_metadata(reader, layout, lane, rows, steps[sel], (lo, hi), warn=False)
            meta["_episode_step"][sel] = m.episode_step
            meta["_flags"][sel] = m.flags
            good[sel] &= m.ok & ~m.lost
    finally:
        reader.close()


def _check_shard(backend: Any, layout: Layout, name: str, shard: int, first_step: int,
                 s0: int, s1: int, rep: VerifyReport, skip: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """Decode slots ``[s0, s1)`` of one shard: ``(values, bad)`` where ``bad`` marks rows
    of inner chunks that fail; ``None`` (and a problem) if the whole shard is bad. Chunks
    whose rows are all in ``skip`` (quarantined) are not decoded."""
    key = layout.shard_key(name, shard)
    where = f"{backend.url}/{key}"
    raw = backend.get(key)
    rep.shards += 1
    if raw is None:
        rep.problems.append(f"{where}: missing (the lane state commits steps "
                            f"{first_step + s0}..{first_step + s1 - 1} in it)")
        return None
    rep.bytes += len(raw)
    n_chunks = layout.chunks_per_shard(name)
    try:
        head = parse_head(raw[: index_size(n_chunks) + HEADER_SIZE], n_chunks, where)
    except ExpstoreError as e:
        rep.problems.append(error_detail(e))
        return None
    if head.first_step != first_step or head.n_rows < s1:
        rep.problems.append(f"{where}: holds steps {head.first_step}.."
                            f"{head.first_step + head.n_rows - 1}, the lane state commits "
                            f"{first_step + s0}..{first_step + s1 - 1} in it")
        return None
    f = layout.fields[name]
    R = layout.chunk_rows(name)
    codec = layout.codec(name)
    out = np.zeros((layout.shard_rows, *f.shape), f.dtype)
    bad = np.zeros(layout.shard_rows, bool)
    skipped = np.ones(layout.shard_rows, bool)
    skipped[s0:s1] = skip if skip is not None else False
    for c in range(s0 // R, -(-s1 // R)):
        if skipped[c * R : (c + 1) * R].all():
            continue
        off, nb = head.offsets[c], head.nbytes[c]
        if off == EMPTY or int(off) + int(nb) > len(raw):
            rep.problems.append(f"{where}: inner chunk {c} is missing or runs past the end of "
                                f"the object ({len(raw)} bytes)")
            bad[c * R : (c + 1) * R] = True
            continue
        try:
            codec.decode(raw[int(off) : int(off) + int(nb)], out=out[c * R : (c + 1) * R])
        except Exception as e:  # numcodecs raises several types
            rep.problems.append(f"{where}: inner chunk {c} does not decode ({e})")
            bad[c * R : (c + 1) * R] = True
    return out[s0:s1], bad[s0:s1]


def _check_rows(url: str, layout: Layout, lane: int, lo: int, st: Any,
                meta: dict[str, np.ndarray], good: np.ndarray, rep: VerifyReport,
                flagged: np.ndarray | None = None) -> None:
    """Row metadata of a lane: step ids, episode positions and flags (rows that fail are
    set in ``flagged``)."""
    steps = np.arange(lo, st.count)
    where = f"{url} lane {lane}"

    def report(mask: np.ndarray, what: str) -> None:
        bad = np.flatnonzero(mask & good)
        if flagged is not None:
            flagged[bad] = True
        if len(bad):
            rep.problems.append(f"{where}: {len(bad)} row(s) {what} (first at step "
                                f"{int(steps[bad[0]])})")

    ep = meta["_episode_step"].astype(np.int64)
    fl = meta["_flags"]
    last = (fl & FLAG_LAST) != 0
    report(meta["_step_id"] != steps, "with a _step_id other than their lane step")
    report(((fl & FLAG_FIRST) != 0) != (ep == 0), "whose FIRST flag disagrees with "
           "episode position 0")
    pair = good[1:] & good[:-1]
    cont = ep[1:] != 0
    bad_next = np.zeros(len(ep), bool)
    bad_next[1:] = pair & cont & ((ep[1:] != ep[:-1] + 1) | last[:-1])
    report(bad_next, "that do not continue the episode of the row before")
    ends = (fl & (FLAG_TERMINATED | FLAG_TRUNCATED)) != 0
    no_final = np.zeros(len(ep), bool)
    # (a first row right after it is fine: the writer was restarted before the final row)
    no_final[:-1] = pair & ends[:-1] & ~last[1:] & ((fl[1:] & FLAG_FIRST) == 0)
    report(no_final, "that end an episode without a final row after them")
    # (a final row after a step that neither terminated nor was truncated is the writer's
    # own: it closes a step whose next_obs the lane's next obs did not continue, appender.py)
    step_rows = ~last
    report(step_rows & (meta["terminated"].astype(bool) != ((fl & FLAG_TERMINATED) != 0)),
           "whose 'terminated' value disagrees with their flags")
    report(step_rows & (meta["truncated"].astype(bool) != ((fl & FLAG_TRUNCATED) != 0)),
           "whose 'truncated' value disagrees with their flags")
    if st.valid_from == 0 and st.count <= layout.lane_capacity and good.all():
        if int(last.sum()) != st.episodes:
            rep.problems.append(f"{where}: the lane state counts {st.episodes} episodes, the "
                                f"rows hold {int(last.sum())} final rows")
