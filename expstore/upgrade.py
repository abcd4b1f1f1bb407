"""``expstore upgrade``: bring a store made by an older expstore up to date, so that it
opens in seconds.

1. A store without an id (``Layout.store_id``, stores made before it existed) gets one: the
   ``expstore`` attribute of the group's ``zarr.json`` and the layout copy in every
   array's ``zarr.json`` (``expstore_layout``, which ``repair`` rebuilds the group from)
   gain ``store_id``, each file replaced atomically, everything else in it kept.
2. The index snapshot (``storage/format/index_snapshot.py``) is written from a scan of the
   metadata shards: every block whose rows the lanes hold, whole and intact, in their
   newest lap. Blocks already there and valid are kept.

Nothing stored is changed or deleted but those ``zarr.json`` attributes; an interrupted
upgrade is finished by running it again. It takes every lane's lease while it runs, so it
refuses a store a writer holds (``StoreLockedError``) and no writer starts meanwhile. A
store that was not upgraded opens as before (its index read from the metadata shards).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .api import new_store_id
from .errors import StoreCorruptError
from .index.rows import RowIndex
from .index_loader import IndexLoader
from .storage.backends import Backend, backend_for
from .storage.format import (
    ROOT_KEY,
    LaneState,
    Layout,
    block_key,
    block_rows,
    blocks_per_lane,
    decode_block,
    encode_block,
    fits,
    read_layout,
    read_quarantine,
    read_states,
    with_store_id,
)
from .storage.ownership import DEFAULT_TTL, LaneLease
from .storage.read import ShardReader
from .write_access import acquire_leases, release_all


@dataclass
class UpgradeReport:
    """What :func:`upgrade_store` did (blocks: index snapshot blocks)."""

    url: str
    store_id: str = ""
    id_added: bool = False  # the store had no id and got ``store_id``
    blocks_written: int = 0
    blocks_kept: int = 0  # already there and valid
    blocks_skipped: int = 0  # rows not all held and intact (the shards serve them)
    rows_covered: int = 0  # rows the snapshot blocks written or kept hold

    def summary(self) -> str:
        head = (f"gave the store id {self.store_id}" if self.id_added
                else f"store id {self.store_id} (already set)")
        return (f"{head}; index snapshot: {self.blocks_written} block(s) written, "
                f"{self.blocks_kept} already valid, {self.blocks_skipped} left to the "
                f"metadata shards; {self.rows_covered:,} rows covered")


def upgrade_store(url: str, storage_options: dict[str, Any] | None = None,
                  lease_ttl: float | None = DEFAULT_TTL,
                  progress: Callable[[int], None] | None = None) -> UpgradeReport:
    """Give the store at ``url`` an id if it has none and write its index snapshot (see the
    module docstring). ``lease_ttl=None``: take no leases (a backend without conditional
    writes; no writer may run meanwhile). ``progress(rows)``: called per block scanned."""
    backend = backend_for(url, storage_options, fsync=True)
    rep = UpgradeReport(backend.url)
    try:
        layout = read_layout(backend)
        leases = acquire_leases(backend, list(range(layout.lanes)), lease_ttl)
        try:
            if layout.store_id is None:
                layout = _give_id(backend, layout)
                rep.id_added = True
            rep.store_id = str(layout.store_id)
            _write_snapshot(backend, layout, list(leases.values()), rep, progress)
        finally:
            release_all(leases.values())
    finally:
        backend.close()
    return rep


def _give_id(backend: Backend, layout: Layout) -> Layout:
    """A new store id into every array's layout copy, then the group's attribute (read by
    ``open``): a run stopped half way leaves the group without one, and runs again."""
    store_id = new_store_id()
    for key in [f"{name}/zarr.json" for name in layout.fields] + [ROOT_KEY]:
        raw = backend.get(key)
        if raw is None:
            continue
        new = with_store_id(raw, store_id, f"{backend.url}/{key}")
        if new is not None:
            backend.put(key, new)
    return dataclasses.replace(layout, store_id=store_id)


def _write_snapshot(backend: Backend, layout: Layout, leases: list[LaneLease],
                    rep: UpgradeReport, progress: Callable[[int], None] | None) -> None:
    reader = ShardReader(backend, layout)
    try:
        states = read_states(backend, list(range(layout.lanes)))
        loader = IndexLoader(backend, layout, RowIndex(layout.lanes, layout.lane_capacity),
                             lambda: reader, read_quarantine(backend), states)
        for st in states:
            for j in range(blocks_per_lane(layout)):
                _one_block(backend, layout, loader, st, j, rep)
                for lease in leases:
                    lease.ensure()
                if progress is not None:
                    progress(block_rows(layout))
    finally:
        reader.close()


def _one_block(backend: Backend, layout: Layout, loader: IndexLoader, st: LaneState,
               j: int, rep: UpgradeReport) -> None:
    """Block ``j`` of lane ``st.lane`` in its newest lap the lane holds whole, written
    unless a valid one is there."""
    B, L = block_rows(layout), layout.lane_capacity
    rows = min(B, L - j * B)
    lap = (st.count - rows - j * B) // L  # newest lap whose block is whole and committed
    first = j * B + lap * L
    if lap < 0 or first < max(st.valid_from, st.count - L):
        rep.blocks_skipped += 1
        return
    key = block_key(st.lane, j)
    raw = backend.get(key)
    if raw is not None:
        try:
            head, _, _ = decode_block(raw, f"{backend.url}/{key}")
            if fits(head, layout, st.lane, j) and head.first_step == first:
                rep.blocks_kept += 1
                rep.rows_covered += rows
                return
        except StoreCorruptError:
            pass  # replaced below
    scan = LaneState(**vars(st))  # (valid_from rises if a writer drops rows meanwhile)
    ep, fl, lost = loader.read_block(scan, first, first + rows)
    if np.any(lost) or scan.valid_from > first:
        rep.blocks_skipped += 1
        return
    backend.put(key, encode_block(str(layout.store_id), st.lane, j, first, ep, fl))
    rep.blocks_written += 1
    rep.rows_covered += rows
