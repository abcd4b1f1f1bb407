"""Make a damaged store usable again, and say exactly what was lost.

:func:`repair_store` runs :func:`~expstore.verify.verify_store`, then

0. rebuilds a lost or unreadable group ``zarr.json`` from the copy of the layout every
   array's ``zarr.json`` keeps, and array ``zarr.json`` files that are missing or that plain
   zarr cannot read as the layout says, from the layout;
1. rebuilds a lane state file that is missing or unreadable from the shard headers (the
   rows every field's shards hold contiguously; the newest shard may add rows its writer
   wrote but had not committed when it died — intact, since every chunk is checksummed);
2. rewrites a bad ``_flags``, ``_episode_step`` or ``_step_id`` chunk from the values the
   rows around it give (``storage/format/metadata_rebuild.py``): their rows are kept;
3. quarantines the lane steps whose bytes are bad (``_state/quarantine.json``): a store
   opened afterwards never samples them, nor any transition, frame stack or n-step window
   that would touch them, and training continues on the rest;
4. checks the repaired lanes again and reports what is still wrong (``remaining``).

Nothing is deleted, and no data chunk is rewritten: the bad shards stay until the writer's
next lap replaces them (a metadata shard whose chunk was rebuilt is replaced atomically,
its other chunks' bytes kept). Run it while no writer is active on the lanes being
repaired (a live writer keeps its own view of its lanes until it is reopened; readers pick
the quarantine up on their next ``refresh()`` within a few seconds).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ExpstoreError, StoreCorruptError, StoreNotFoundError, error_detail
from .rows import FLAG_LAST
from .storage.backends import Backend, backend_for
from .storage.format import (
    HEADER_SIZE,
    ROOT_KEY,
    STATE_VERSION,
    LaneState,
    Layout,
    Quarantine,
    ShardHead,
    check_arrays,
    derive_step_ids,
    drop_blocks,
    expected_metadata,
    index_size,
    layout_from_arrays,
    parse_head,
    read_layout,
    read_metadata,
    read_quarantine,
    read_state,
    rewrite_chunks,
    state_key,
    write_quarantine,
    write_state,
)
from .verify import VerifyReport, verify_store


@dataclass
class RepairReport:
    """What :func:`repair_store` found and did. Counts are rows (lane steps)."""

    url: str
    found: VerifyReport | None = None  # the verify run before repairing
    newly_lost: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    lost_rows: int = 0  # rows quarantined by this repair
    #: with ``release_intact``: per lane, quarantined ranges read again, found intact and
    #: released (sampled again); ``released_rows`` rows in all
    released: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    released_rows: int = 0
    quarantined_rows: int = 0  # rows of the stores' current window quarantined in total
    rebuilt: dict[int, LaneState] = field(default_factory=dict)  # lanes whose state was rebuilt
    #: zarr.json files rebuilt (key -> what was wrong with it)
    metadata: dict[str, str] = field(default_factory=dict)
    remaining: list[str] = field(default_factory=list)  # problems repair could not fix
    #: metadata shards whose bad chunk was rewritten from derived values (key -> chunks)
    rewritten: dict[str, list[int]] = field(default_factory=dict)
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        """The store opens and samples (every problem left was quarantined)."""
        return not self.remaining

    def summary(self) -> str:
        verb = "would quarantine" if self.dry_run else "quarantined"
        parts = [f"{'would rebuild' if self.dry_run else 'rebuilt'} {key} ({why})"
                 for key, why in self.metadata.items()]
        parts += [f"{'would rewrite' if self.dry_run else 'rewrote'} {key} (chunk(s) "
                  f"{', '.join(map(str, chunks)) or 'bad'}) from the rows around it"
                  for key, chunks in self.rewritten.items()]
        parts.append(f"{verb} {self.lost_rows:,} row(s)")
        if self.released_rows:
            parts.append(f"{'would release' if self.dry_run else 'released'} "
                         f"{self.released_rows:,} quarantined row(s) found intact")
        for lane, ranges in sorted(self.newly_lost.items()):
            parts.append(f"lane {lane}: steps " + ", ".join(
                f"{a}..{b - 1}" if b - a > 1 else str(a) for a, b in ranges))
        for lane, st in sorted(self.rebuilt.items()):
            parts.append(f"lane {lane}: state rebuilt (rows {st.valid_from}..{st.count - 1})")
        parts.append(f"{self.quarantined_rows:,} row(s) of the store are quarantined in all")
        if self.remaining:
            parts.append(f"{len(self.remaining)} problem(s) remain")
        return "; ".join(parts)


def repair_store(url: str, storage_options: dict[str, Any] | None = None,
                 progress: Callable[[int], None] | None = None,
                 dry_run: bool = False,
                 total: Callable[[int], None] | None = None,
                 release_intact: bool = False) -> RepairReport:
    """Rebuild lost metadata and lane states and quarantine bad rows of the store at
    ``url``; ``total``/``progress``: see :func:`~expstore.verify.verify_store`.
    ``release_intact``: also read the quarantined rows again and release those that pass
    every check (rows an earlier repair quarantined wrongly: before this release, verify
    took the final row closing a broken stream for corruption). A process that has the
    store open samples the released rows after its next ``refresh()`` that re-reads the
    quarantine (within a few seconds), as it drops newly quarantined ones."""
    backend = backend_for(url, storage_options, fsync=True)
    rep = RepairReport(backend.url, dry_run=dry_run)
    try:
        layout = _repair_metadata(backend, rep, dry_run)
        if layout is None:
            return rep
        for lane in range(layout.lanes):
            _maybe_rebuild_state(backend, layout, lane, rep, dry_run)
        if dry_run and rep.rebuilt:
            rep.remaining.append("dry run: lanes with a rebuilt state were not verified")
        rep.found = found = verify_store(url, storage_options, progress, total=total,
                                         recheck_quarantined=release_intact)
        try:
            q = read_quarantine(backend)
        except StoreCorruptError as e:  # keep going: verify decides what is lost anew
            rep.remaining.append(f"{error_detail(e)} (replaced)")
            q = Quarantine()
        for lane, shards in found.rebuildable.items():
            _rewrite_metadata(backend, layout, lane, shards, rep, dry_run)
        for lane, ranges in found.lost.items():
            rep.newly_lost[lane] = list(ranges)
            for a, b in ranges:
                q.add(lane, a, b)
                rep.lost_rows += b - a
        for lane, ranges in found.intact_quarantined.items():
            rep.released[lane] = list(ranges)
            for a, b in ranges:
                q.release(lane, a, b)
                rep.released_rows += b - a
        windows = {}
        for lane in range(layout.lanes):
            try:
                st = read_state(backend, lane)
            except (ExpstoreError, OSError):
                continue
            lo = max(st.valid_from, st.count - layout.lane_capacity)
            windows[lane] = (lo, st.count)
            q.prune(lane, lo)
            rep.quarantined_rows += q.count(lane, lo, st.count)
        if not dry_run and (found.lost or q.lanes != _current(backend)):
            write_quarantine(backend, q)
        recheck = sorted(set(found.lost) | set(rep.rebuilt) | set(found.rebuildable))
        unrelated = [p for p in found.problems if not _about_rows(p)]
        if dry_run:  # what the rebuilt zarr.json files would fix is not left
            rep.remaining += [p for p in unrelated
                              if not any(f"/{key}:" in p for key in rep.metadata)]
        elif recheck or unrelated:
            again = verify_store(url, storage_options, lanes=None if unrelated else recheck)
            rep.remaining += again.problems
        return rep
    finally:
        backend.close()


def _current(backend: Backend) -> dict[int, Any]:
    try:
        return read_quarantine(backend).lanes
    except StoreCorruptError:
        return {}


def _about_rows(problem: str) -> bool:
    """Problems verify attributes to rows (which quarantining resolves)."""
    return "_state/" not in problem and "zarr.json" not in problem


# -- metadata chunks derived from the rows around them ---------------------------------------
def _rewrite_metadata(backend: Backend, layout: Layout, lane: int,
                      shards: list[tuple[str, int, int]], rep: RepairReport,
                      dry_run: bool) -> None:
    """Rewrite the bad chunks of metadata shards with the values their rows' neighbours
    give (rows nothing can rebuild are in ``found.lost``: quarantined, written as 0)."""
    from .storage.read import ShardReader

    S, Lc = layout.shard_rows, layout.lane_capacity
    st = read_state(backend, lane)
    lo = max(st.valid_from, st.count - Lc)
    reader = ShardReader(backend, layout)
    try:
        for name, shard, fs in shards:
            key = layout.shard_key(name, shard)
            if dry_run:
                rep.rewritten[key] = []
                continue
            a, b = max(lo, fs), min(st.count, fs + S)
            f = layout.fields[name]
            values = np.full(S, -1 if name == "_step_id" else 0, f.dtype)
            if name == "_step_id":
                values[a - fs: b - fs] = derive_step_ids(a, b - a)
            else:
                steps = np.arange(a, b, dtype=np.int64)
                rows = layout.lane_rows(lane, steps)
                m = read_metadata(reader, layout, lane, rows, steps, (lo, st.count), warn=False)
                got = m.episode_step if name == "_episode_step" else m.flags
                values[a - fs: b - fs] = np.where(m.lost, 0, got)
            try:
                rep.rewritten[key] = rewrite_chunks(backend, layout, name, shard, values)
            except (StoreCorruptError, OSError) as e:
                rep.remaining.append(f"{backend.url}/{key}: not rewritten ({error_detail(e)})")
            reader.forget(shard)
    finally:
        reader.close()


# -- zarr metadata -------------------------------------------------------------------------
def _repair_metadata(backend: Backend, rep: RepairReport, dry_run: bool) -> Layout | None:
    """The store's layout, rebuilding a lost or unreadable group ``zarr.json`` from the copy
    the arrays keep, and array ``zarr.json`` files plain zarr cannot use from the layout."""
    try:
        layout = read_layout(backend)
    except StoreNotFoundError:  # nothing to repair (never write into a path without one)
        raise
    except (ExpstoreError, OSError, ValueError) as e:
        try:
            layout = layout_from_arrays(backend)
        except StoreCorruptError as e2:
            rep.remaining.append(f"{backend.url}/{ROOT_KEY}: {error_detail(e)} (cannot "
                                 f"repair: {error_detail(e2)})")
            return None
        rep.metadata[ROOT_KEY] = f"{error_detail(e)}; rebuilt from the arrays' copy"
        if not dry_run:
            backend.put(ROOT_KEY, expected_metadata(layout)[ROOT_KEY])
    broken = check_arrays(backend, layout)
    if broken:
        want = expected_metadata(layout)
        for key, problem in broken:
            rep.metadata[key] = f"{problem.split(': ', 1)[-1]}; rebuilt from the layout"
            if not dry_run:
                backend.put(key, want[key])
    return layout


# -- lane states ---------------------------------------------------------------------------
def _maybe_rebuild_state(backend: Backend, layout: Layout, lane: int, rep: RepairReport,
                         dry_run: bool) -> None:
    key = state_key(lane)
    try:
        read_state(backend, lane)
        return
    except StoreCorruptError as e:
        raw = backend.get(key)
        version = _state_version(raw)
        if version is not None and version > STATE_VERSION:
            rep.remaining.append(f"{error_detail(e)} (not repaired: written by a newer "
                                 "expstore)")
            return
    st = rebuild_state(backend, layout, lane)
    rep.rebuilt[lane] = st
    if not dry_run:
        st.generation = 0
        drop_blocks(backend, layout, lane)  # (its snapshot blocks may know other steps)
        write_state(backend, st)


def _state_version(raw: bytes | None) -> int | None:
    try:
        return int(json.loads(raw)["state"]["version"])
    except (TypeError, ValueError, KeyError):
        return None


def rebuild_state(backend: Backend, layout: Layout, lane: int) -> LaneState:
    """The lane state the shards of ``lane`` support: the newest run of consecutive steps
    that every field's shards hold (``episodes`` counts the final rows in it)."""
    S, spl, Lc = layout.shard_rows, layout.shards_per_lane, layout.lane_capacity
    held: dict[int, tuple[int, int]] = {}  # first_step -> (slot, rows all fields hold)
    for k in range(spl):
        heads = [_head(backend, layout, name, lane * spl + k) for name in layout.fields]
        if any(h is None for h in heads) or len({h.first_step for h in heads}) != 1:
            continue  # missing, corrupt, or fields from different laps (a torn flush)
        held[heads[0].first_step] = (k, min(h.n_rows for h in heads))
    if not held:
        return LaneState(lane)
    newest = max(held)
    count = newest + held[newest][1]
    valid_from = newest
    while valid_from - S in held and held[valid_from - S][1] == S and \
            valid_from - S >= newest + S - Lc:
        valid_from -= S
    st = LaneState(lane, count, valid_from, 0, 0)
    st.episodes = _count_finals(backend, layout, lane, valid_from, count)
    return st


def _head(backend: Backend, layout: Layout, name: str, shard: int) -> ShardHead | None:
    key = layout.shard_key(name, shard)
    h = backend.open_object(key)
    if h is None:
        return None
    n_chunks = layout.chunks_per_shard(name)
    try:
        (raw,) = backend.read_ranges([(h, 0, index_size(n_chunks) + HEADER_SIZE)])
        return parse_head(raw, n_chunks, f"{backend.url}/{key}")
    except (StoreCorruptError, OSError):
        return None
    finally:
        backend.close_object(h)


def _count_finals(backend: Backend, layout: Layout, lane: int, lo: int, hi: int) -> int:
    """Final rows among steps ``[lo, hi)`` of ``lane`` (0 where ``_flags`` is unreadable)."""
    from .storage.read import ShardReader

    if hi <= lo:
        return 0
    reader = ShardReader(backend, layout)
    steps = np.arange(lo, hi, dtype=np.int64)
    rows = layout.lane_rows(lane, steps)
    flags = np.zeros(len(rows), np.uint8)
    try:
        ok = reader.read("_flags", rows, steps, flags)
    except StoreCorruptError:
        return 0
    finally:
        reader.close()
    return int(np.count_nonzero(flags[ok] & FLAG_LAST))
