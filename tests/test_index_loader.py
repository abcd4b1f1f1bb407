"""The index loader on its own (``expstore/index_loader.py``): handed a backend, a layout,
an index and a reader, it indexes lanes as ``open`` does, skips rows a writer lapping the
load dropped, and calls a row damage only after ``DAMAGE_READS`` misses under one lane
state."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import expstore as es
from expstore import index_loader
from expstore.errors import StoreCorruptError
from expstore.index.rows import RowIndex
from expstore.index_loader import DAMAGE_READS, IndexLoader
from expstore.storage import backend_for
from expstore.storage.format import read_quarantine, read_states
from expstore.storage.read import ShardReader


def _store(url: str, steps: int = 300) -> None:
    spec = es.Spec.create(obs=es.Field((), np.float32), action=es.Field((), np.int64))
    store = es.create(url, spec, capacity=256, shard_rows=32)
    t = np.arange(steps)
    ends = (t + 1) % 40 == 0
    store.extend(dict(obs=t.astype(np.float32), action=t % 5, reward=np.zeros(steps),
                      terminated=ends, truncated=np.zeros(steps, bool),
                      next_obs=(t + 1).astype(np.float32)))
    store.close()


def _loader(url: str, reader: object | None = None) -> IndexLoader:
    backend = backend_for(url)
    layout = es.open(url).layout
    reader = reader or ShardReader(backend, layout)
    return IndexLoader(backend, layout, RowIndex(layout.lanes, layout.lane_capacity),
                       lambda: reader, read_quarantine(backend),
                       read_states(backend, list(range(layout.lanes))))


def test_the_loader_indexes_a_lane_as_open_does(tmp_path):
    url = str(tmp_path / "s.zarr")
    _store(url)
    loader = _loader(url)
    loader.load_lane(loader.states[0])
    with es.open(url) as store:
        for name in ("count", "committed", "valid_from", "flags", "episode_step"):
            assert np.array_equal(getattr(loader.index, name), getattr(store.index, name))
        assert loader.states[0] == store._states[0]


class _Missing:
    """A shard reader that does not deliver ``_flags`` of steps below ``below``."""

    def __init__(self, reader: ShardReader, below: int) -> None:
        self.reader, self.below, self.reads = reader, below, 0

    def read(self, name, rows, steps, out):
        ok = self.reader.read(name, rows, steps, out)
        if name == "_flags":
            self.reads += 1
            ok = ok & (np.asarray(steps) >= self.below)
        return ok

    def drop_chunks(self, name):
        self.reader.drop_chunks(name)


def test_a_row_missed_under_one_state_is_damage_after_damage_reads(tmp_path):
    url = str(tmp_path / "s.zarr")
    _store(url)
    loader = _loader(url)
    st = loader.states[0]
    missing = _Missing(loader.reader(), st.valid_from + 5)
    loader.reader = lambda: missing
    with pytest.raises(StoreCorruptError, match=f"does not hold step {st.valid_from}"):
        loader.load_lane(st)
    assert missing.reads == DAMAGE_READS


def test_rows_the_writer_dropped_meanwhile_are_skipped(tmp_path, monkeypatch):
    """The shard misses rows, and a fresh read of the lane state says the writer dropped
    them (its valid_from is past them, a new generation): no error, the index starts
    after them."""
    url = str(tmp_path / "s.zarr")
    _store(url)
    loader = _loader(url)
    st = loader.states[0]
    dropped = st.valid_from + 32
    missing = _Missing(loader.reader(), dropped)
    loader.reader = lambda: missing
    moved = dataclasses.replace(st, valid_from=dropped, generation=st.generation + 1)
    monkeypatch.setattr(index_loader, "read_state", lambda backend, lane: moved)
    loader.load_lane(st)
    assert int(loader.index.valid_from[0]) == loader.states[0].valid_from == dropped
    assert int(loader.index.count[0]) == st.count
    with es.open(url) as store:
        rows = store.index.lane_rows(0, np.arange(dropped, st.count))
        assert np.array_equal(loader.index.flags[rows], store.index.flags[rows])


def test_a_run_of_rows_decodes_each_metadata_chunk_once(tmp_path):
    """A refresh increment (or a lane's tail at open) reads consecutive rows: each
    metadata chunk (one per shard) is read and decoded once, not once per row, as the
    batch path for scattered rows would (~4 µs a row)."""
    url = str(tmp_path / "s.zarr")
    _store(url, steps=250)  # 256 rows committed of 32-row shards: 8 shards
    reader = ShardReader(backend_for(url), es.open(url).layout)
    loader = _loader(url, reader)
    st = loader.states[0]
    loader.read_block(dataclasses.replace(st), st.valid_from, st.count)
    shards = -(-(st.count - st.valid_from) // 32)
    assert reader.stats.chunks <= 2 * (shards + 1)  # _episode_step and _flags
