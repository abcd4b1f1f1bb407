"""``ShardReader.read_fields``: a batch's small fields in one kernel call where the hot set
holds every row asked for (``gather_held``), and field by field otherwise, with the same
values and masks as :meth:`ShardReader.read` gives each field alone."""

from __future__ import annotations

import numpy as np
import pytest
from test_batch_path import make_store, write

from expstore.storage import backend_for
from expstore.storage.native.kernels import native
from expstore.storage.read import ShardReader
from expstore.storage.read import reader as reader_mod

pytestmark = pytest.mark.skipif(native is None, reason="C kernel not built")
NAMES = ["step", "action", "reward", "terminated"]  # (held in another order: codes first)


@pytest.fixture
def calls(monkeypatch):
    """Counts the one-call gathers ``read_fields`` makes (and whether each served)."""
    seen: list[bool] = []
    real = reader_mod.gather_held

    def counted(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(reader_mod, "gather_held", counted)
    return seen


def _store(tmp_path):
    store = make_store(tmp_path / "s.zarr", capacity=512, shard_rows=64)
    write(store, 0, 0, 450)
    store.flush()
    rows = np.arange(store.capacity)
    steps = store.index.steps(rows)
    keep = (steps >= 0) & (steps < store.index.count[0])
    return store, rows[keep], steps[keep]


def _alone(reader, names, rows, steps):
    out = {}
    for n in names:
        f = reader.layout.fields[n]
        vals = np.zeros((len(rows), *f.shape), f.dtype)
        out[n] = (vals, reader.read(n, rows, steps, vals))
    return out


def _same(got, want):
    assert list(got) == list(want)  # (in the order asked: batches keep it)
    for n, (vals, ok) in want.items():
        assert np.array_equal(got[n][1], ok), n
        assert np.array_equal(got[n][0][ok], vals[ok]), n


@pytest.mark.parametrize("hot_bytes", [None, 8 << 10], ids=["decoded", "codes"])
def test_held_fields_come_in_one_call_as_each_field_alone_reads_them(tmp_path, calls,
                                                                     hot_bytes) -> None:
    store, rows, steps = _store(tmp_path)
    kw = {} if hot_bytes is None else {"values_budget": hot_bytes}
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0, **kw)
    other = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0, **kw)
    rng = np.random.default_rng(3)
    reader.read_fields(NAMES, rows, steps)  # the hot set filled
    coded = [n for n in NAMES if reader.tables[n].code is not None]
    assert coded == ([] if hot_bytes is None else ["action", "terminated"])
    calls.clear()
    for _ in range(10):
        pick = rng.choice(len(rows), 64)
        _same(reader.read_fields(NAMES, rows[pick], steps[pick]),
              _alone(other, NAMES, rows[pick], steps[pick]))
    assert calls == [True] * 10
    reader.close()
    other.close()
    store.close()


def test_a_row_not_held_sends_the_batch_field_by_field(tmp_path, calls) -> None:
    """A step the store does not hold at a row (a lap the reader's plan did not see): the
    one call writes nothing, and each field's own path refuses that row alone."""
    store, rows, steps = _store(tmp_path)
    reader = ShardReader(backend_for(store.url), store.layout, row_cache_bytes=0)
    reader.read_fields(NAMES, rows, steps)
    pick = np.arange(0, 64)
    wrong = steps[pick].copy()
    wrong[5] += store.capacity  # not there
    calls.clear()
    got = reader.read_fields(NAMES, rows[pick], wrong)
    assert calls == [False]
    for n in NAMES:
        assert not got[n][1][5] and got[n][1].sum() == 63
    _same(got, _alone(reader, NAMES, rows[pick], wrong))
    reader.close()
    store.close()
