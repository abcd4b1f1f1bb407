"""The row index's C loops (``expstore/index/_rows.c``) against its numpy code.

Random index states (several lanes, wrapped rings, episodes, final and lost rows, staged
rows not yet committed, a raised ``valid_from``) are asked the same questions with and
without the C module: ``valid``, uniform ``draw_valid``, ``windows``, and whole sampler
plans from a real store. The answers must be identical, row for row.
``EXPSTORE_REQUIRE_NATIVE=1`` (set by CI) turns a missing module into a failure.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import expstore as es
from expstore.index import rows as rows_mod
from expstore.index.rows import RowIndex
from expstore.rows import FLAG_BAD, FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED

native = rows_mod.native
if native is None and os.environ.get("EXPSTORE_REQUIRE_NATIVE"):
    raise RuntimeError("expstore.index._rows was not built (EXPSTORE_REQUIRE_NATIVE=1)")
pytestmark = pytest.mark.skipif(native is None, reason="C index kernel not built")


def random_index(rng: np.random.Generator, lanes: int, L: int) -> RowIndex:
    """Lanes written for up to 3 laps in episodes of 1-6 rows (final rows included), some
    rows lost, the newest rows of some lanes not committed, ``valid_from`` raised."""
    idx = RowIndex(lanes, L)
    for lane in range(lanes):
        n = int(rng.integers(0, 3 * L))
        step, pos = 0, 0
        ep_len = int(rng.integers(1, 7))
        while step < n:
            row = lane * L + step % L
            flags = FLAG_FIRST if pos == 0 else 0
            if pos == ep_len:  # the final row
                flags |= FLAG_LAST
            elif pos == ep_len - 1 and rng.random() < 0.5:
                flags |= FLAG_TERMINATED
            if rng.random() < 0.03:
                flags = FLAG_BAD | FLAG_FIRST
            idx.episode_step[row] = pos
            idx.flags[row] = flags
            if pos == ep_len:
                pos, ep_len = 0, int(rng.integers(1, 7))
            else:
                pos += 1
            step += 1
        idx.count[lane] = n
        idx.committed[lane] = max(0, n - int(rng.integers(0, 4)))
        idx.valid_from[lane] = max(0, n - L + int(rng.integers(0, 3)))
    return idx


def numpy_only(monkeypatch):
    monkeypatch.setattr(rows_mod, "native", None)


CASES = [(1, 8), (1, 16), (3, 8), (5, 16)]


@pytest.mark.parametrize("lanes,L", CASES)
def test_valid_is_the_same_in_c_and_numpy(monkeypatch, lanes, L):
    rng = np.random.default_rng(lanes * 100 + L)
    for _ in range(40):
        idx = random_index(rng, lanes, L)
        rows = np.arange(idx.capacity, dtype=np.int64)
        asked = [(h, n, g, c) for h in (0, 1, 3) for n in (1, 2, 3) for g in (0, 2)
                 for c in (False, True)]
        fast = [idx.valid(rows, *a) for a in asked]
        with monkeypatch.context() as m:
            numpy_only(m)
            slow = [idx.valid(rows, *a) for a in asked]
        for a, f, s in zip(asked, fast, slow):
            assert f.dtype == s.dtype == bool
            np.testing.assert_array_equal(f, s, err_msg=f"history/horizon/guard/committed {a}")


@pytest.mark.parametrize("lanes,L", CASES)
def test_windows_are_the_same_in_c_and_numpy(monkeypatch, lanes, L):
    rng = np.random.default_rng(7 + lanes * 100 + L)
    seen_pad = seen_short = seen_bad = False
    for _ in range(40):
        idx = random_index(rng, lanes, L)
        anchors = np.flatnonzero(idx.valid(np.arange(idx.capacity), 3, 3))
        if not len(anchors):
            continue
        for k in (1, 2, 4):
            for n_step in (1, 3):
                for committed in (False, True):
                    fast = idx.windows(anchors, k, n_step, committed, k - 1, 1)
                    with monkeypatch.context() as m:
                        numpy_only(m)
                        slow = idx.windows(anchors, k, n_step, committed, k - 1, 1)
                    assert len(fast) == len(slow) == 9
                    for name, f, s in zip(("steps", "m", "obs_rows", "obs_pad", "obs_steps",
                                           "next_rows", "next_pad", "next_steps", "ok"),
                                          fast, slow):
                        assert f.dtype == s.dtype and f.shape == s.shape, name
                        np.testing.assert_array_equal(f, s, err_msg=name)
                    seen_pad |= bool(fast[3].any())
                    seen_short |= bool((fast[1] < n_step).any())
                    seen_bad |= not fast[8].all()
    # stacks clamped at episode starts, horizons cut short, anchors valid for history 3 and
    # horizon 3 but not for guard 1
    assert seen_pad and seen_short and seen_bad


@pytest.mark.parametrize("lanes,L", CASES)
def test_uniform_draws_land_on_the_same_rows_in_c_and_numpy(monkeypatch, lanes, L):
    rng = np.random.default_rng(11 + lanes * 100 + L)
    for _ in range(40):
        idx = random_index(rng, lanes, L)
        for guard, committed in ((0, False), (2, True)):
            total = int(idx.present(guard, committed).sum())
            if total == 0:
                continue
            draws = rng.integers(0, total, size=64)
            for need in (1, 5, 64):
                got = []
                for off in (False, True):
                    out = np.full(need + 2, -7, np.int64)
                    with monkeypatch.context() as m:
                        if off:
                            numpy_only(m)
                        filled = idx.draw_valid(draws, out, 2, 1, 2, guard, committed)
                    got.append((filled, out.copy()))
                assert got[0][0] == got[1][0]
                np.testing.assert_array_equal(got[0][1], got[1][1])
                assert (got[0][1][:2] == -7).all()  # nothing written before ``filled``
                rows = got[0][1][2:got[0][0]]
                assert idx.valid(rows, 1, 2, guard, committed).all()


def test_rows_outside_the_index_take_the_numpy_path():
    idx = RowIndex(2, 8)
    idx.count[:] = 5
    idx.flags[[0, 8]] = FLAG_FIRST
    rows = np.array([1, 2, 16, 9], np.int64)  # 16: past the index
    with pytest.raises(IndexError):  # numpy's answer, as before the C loop
        idx.valid(rows)
    assert idx.valid(np.array([1, 9, 4, 12])).tolist() == [True, True, False, False]


def test_bad_arrays_are_refused_with_the_argument_named():
    idx = RowIndex(1, 8)
    ok = np.empty(3, bool)
    with pytest.raises(TypeError, match="rows"):
        native.valid(np.zeros(3, np.float64), idx.count, idx.count, idx.count, idx.flags,
                     idx.episode_step, 8, 0, 1, (1, 1, 2), ok)
    with pytest.raises(ValueError, match="ok"):
        native.valid(np.zeros(2, np.int64), idx.count, idx.count, idx.count, idx.flags,
                     idx.episode_step, 8, 0, 1, (1, 1, 2), ok)
    with pytest.raises(ValueError, match="draws"):
        native.uniform(np.array([5], np.int64), idx.count, idx.valid_from, idx.count,
                       idx.flags, idx.episode_step, 8, 0, 1, (1, 1, 2), np.empty(1, np.int64),
                       0)


def _episodes_store(path, lanes: int) -> es.Store:
    """Episodes of 2-29 steps (terminated or truncated) in every lane, a lap and a half."""
    spec = es.Spec.create(obs=es.Field((3, 3), np.uint8, stack=4),
                          action=es.Field((), np.int64))
    store = es.create(path, spec, capacity=256 * lanes, lanes=lanes, shard_rows=32)
    rng = np.random.default_rng(3)
    for lane in range(lanes):
        for _ in range(28):
            n = int(rng.integers(2, 30))
            frames = rng.integers(0, 255, (n + 1, 3, 3), np.uint8)
            terminated = bool(rng.random() < 0.5)
            for t in range(n):
                end = t == n - 1
                store.add(frames[t], int(rng.integers(0, 4)), 1.0, frames[t + 1],
                          end and terminated, end and not terminated, lane=lane)
    return store


@pytest.mark.parametrize("lanes", [1, 3])
def test_sampler_plans_are_the_same_in_c_and_numpy(tmp_path, monkeypatch, lanes):
    """The same seed gives the same plans (rows, windows, horizons) and the same batches."""
    store = _episodes_store(tmp_path / "s.zarr", lanes)
    store.flush()
    for n_step, guard in ((1, 0), (3, 5)):
        plans = []
        for off in (False, True):
            with monkeypatch.context() as m:
                if off:
                    numpy_only(m)
                sampler = es.UniformSampler(store, n_step=n_step, guard=guard, seed=5)
                plans.append([sampler.plan(32, batches=2) for _ in range(20)])
        for a, b in zip(*plans):
            for name in ("rows", "steps", "weight", "obs_rows", "obs_pad", "obs_steps",
                         "next_rows", "next_pad", "next_steps", "horizon"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name), name)
    batches = []
    for off in (False, True):
        with monkeypatch.context() as m:
            if off:
                numpy_only(m)
            batches.append(store.sample(64, rng=np.random.default_rng(9)))
    for k in batches[0]:
        np.testing.assert_array_equal(batches[0][k], batches[1][k], k)
    store.close()
