"""Tests for the numpy sum-tree / min-tree priority index."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from expstore.index import PriorityTree


class DeepTree(PriorityTree):
    """Same structure with a tiny top level, so small trees have many block levels."""

    TOP = 2


TREES = [PriorityTree, DeepTree]


def random_priorities(rng: np.random.Generator, n: int, zero_frac: float = 0.3) -> np.ndarray:
    p = rng.uniform(0.05, 1.0, n).astype(np.float32)
    p[rng.random(n) < zero_frac] = 0
    return p


def reference_search(leaves: np.ndarray, values: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.cumsum(leaves.astype(np.float64)), values, side="right")


@pytest.mark.parametrize("cls", TREES)
def test_sampling_frequencies_chisquare(cls: type[PriorityTree]) -> None:
    rng = np.random.default_rng(12345)
    n = 300
    p = random_priorities(rng, n)
    tree = cls.from_leaves(p)
    draws = np.concatenate([tree.sample(256, rng) for _ in range(400)])  # 102,400 draws
    counts = np.bincount(draws, minlength=n)
    assert counts[p == 0].sum() == 0
    nz = p > 0
    expected = draws.size * p[nz].astype(np.float64) / p[nz].sum(dtype=np.float64)
    assert expected.min() > 5
    assert chisquare(counts[nz], expected).pvalue > 1e-3


def test_sampling_frequencies_multilevel_binned() -> None:
    # 50k leaves: 2 block levels below the top level with the default TOP
    rng = np.random.default_rng(7)
    n = 50_000
    p = random_priorities(rng, n) * rng.uniform(0.1, 10.0, n).astype(np.float32)
    tree = PriorityTree.from_leaves(p)
    assert len(tree._sums) == 2
    draws = np.concatenate([tree.sample(1000, rng) for _ in range(200)])
    assert (p[draws] > 0).all()
    bins = np.arange(n) // 250  # 200 bins of 250 consecutive leaves
    counts = np.bincount(bins[draws], minlength=200)
    mass = np.bincount(bins, weights=p.astype(np.float64), minlength=200)
    assert chisquare(counts, draws.size * mass / mass.sum()).pvalue > 1e-3


@pytest.mark.parametrize("cls", TREES)
def test_stratified_sample_is_sorted_and_typed(cls: type[PriorityTree]) -> None:
    rng = np.random.default_rng(0)
    tree = cls.from_leaves(random_priorities(rng, 1000))
    s = tree.sample(64, rng)
    assert s.dtype == np.int64 and s.shape == (64,)
    assert (np.diff(s) >= 0).all()  # one draw per increasing segment
    assert tree.sample(0, rng).shape == (0,)


_priority = st.one_of(
    st.just(0.0),
    st.floats(1e-45, 1e-30),
    st.floats(1e-3, 1e3),
    st.floats(1e30, 3e38),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prios=st.lists(_priority, min_size=1, max_size=200),
    seed=st.integers(0, 2**32 - 1),
    deep=st.booleans(),
)
def test_zero_priority_leaves_never_returned(prios: list[float], seed: int, deep: bool) -> None:
    cls = DeepTree if deep else PriorityTree
    leaves = np.array(prios, dtype=np.float32)
    if not (leaves > 0).any():
        with pytest.raises(ValueError, match="empty"):
            cls.from_leaves(leaves).sample(4, np.random.default_rng(seed))
        return
    rng = np.random.default_rng(seed)
    tree = cls.from_leaves(leaves)
    total = tree.total
    # segment edges and the extremes, where rounding could land on a zero leaf
    edges = np.concatenate([
        np.arange(0, 65) * (total / 64),
        np.nextafter(np.arange(1, 65) * (total / 64), 0.0),
        [0.0, total, np.nextafter(total, 0.0), 2 * total, -1.0],
        np.cumsum(leaves.astype(np.float64)),
        rng.random(64) * total,
    ])
    for idx in (tree.find_prefix_sum(edges), tree.sample(257, rng), tree.sample(1, rng)):
        assert (leaves[idx] > 0).all()
    # the same tree built by updates (random order, one batch per call)
    tree2 = cls(leaves.size)
    perm = rng.permutation(leaves.size)
    for part in np.array_split(perm, 3):
        tree2.update(part, leaves[part])
    assert (leaves[tree2.find_prefix_sum(edges)] > 0).all()
    assert (leaves[tree2.sample(100, rng)] > 0).all()


@pytest.mark.parametrize("cls", TREES)
def test_find_prefix_sum_matches_cumsum_searchsorted(cls: type[PriorityTree]) -> None:
    rng = np.random.default_rng(3)
    p = random_priorities(rng, 5000)
    tree = cls.from_leaves(p)
    v = rng.random(10_000) * tree.total
    assert np.array_equal(tree.find_prefix_sum(v), reference_search(p, v))
    top = np.concatenate([[0.0], np.add.accumulate(tree._sums[-1])])
    exact = tree._descend(v.copy(), top, fast=False)  # the sequential-cumsum repair path
    assert np.array_equal(exact, reference_search(p, v))


@pytest.mark.parametrize("cls", TREES)
def test_sums_do_not_drift(cls: type[PriorityTree]) -> None:
    rng = np.random.default_rng(11)
    n = 4096
    tree = cls(n)
    for _ in range(1000):  # 1e6 random updates, wide dynamic range, some zeros
        idx = rng.integers(0, n, 1000)
        pri = rng.random(1000) * 10.0 ** rng.integers(-6, 7, 1000)
        pri[rng.random(1000) < 0.05] = 0.0
        tree.update(idx, pri)
    leaves = tree.state().astype(np.float64)
    ref = np.sum(leaves)
    assert abs(tree.total - ref) <= 1e-9 * ref
    assert tree.min == leaves[leaves > 0].min()
    # every internal node equals the float64 sum of its leaves
    span = 8
    for sums in tree._sums:
        padded = np.zeros(sums.size * span)
        padded[: min(leaves.size, padded.size)] = leaves[: padded.size]
        ref_nodes = padded.reshape(-1, span).sum(axis=1)
        np.testing.assert_allclose(sums, ref_nodes, rtol=1e-12, atol=0)
        span *= 8


@pytest.mark.parametrize("cls", TREES)
def test_min_tracks_present_leaves(cls: type[PriorityTree]) -> None:
    rng = np.random.default_rng(5)
    n = 777
    tree = cls(n)
    assert tree.min == np.inf and tree.total == 0.0
    ref = np.zeros(n, dtype=np.float32)
    for _ in range(200):
        idx = rng.integers(0, n, 20)
        pri = rng.random(20).astype(np.float32)
        pri[rng.random(20) < 0.4] = 0
        tree.update(idx, pri)
        ref[idx] = pri  # numpy 1-D fancy assignment: last duplicate wins
        expect = ref[ref > 0].min() if (ref > 0).any() else np.inf
        assert tree.min == expect
    tree.clear(np.arange(n))
    assert tree.min == np.inf and tree.total == 0.0


def test_duplicate_indices_last_wins() -> None:
    tree = PriorityTree(10)
    tree.update(np.array([3, 5, 3, 3, 5]), np.array([1.0, 2.0, 7.0, 4.0, 0.5]))
    assert tree.get(np.array([3, 5])).tolist() == [4.0, 0.5]
    assert tree.total == 4.5
    rng = np.random.default_rng(9)
    tree = DeepTree(300)
    ref = np.zeros(300)
    for _ in range(50):
        idx = rng.integers(0, 40, 100)  # many duplicates per call
        pri = rng.integers(0, 100, 100).astype(np.float64)
        tree.update(idx, pri)
        for i, v in zip(idx, pri, strict=True):
            ref[i] = v
        assert np.array_equal(tree.get(np.arange(300)), ref)
        assert tree.total == ref.sum()


def test_get_clear_scalar_broadcast_and_dtypes() -> None:
    tree = PriorityTree(100)
    tree.update(np.arange(10, dtype=np.int32), 2.5)
    tree.update(np.array([20], dtype=np.uint64), np.array([1], dtype=np.int64))
    got = tree.get(np.arange(22))
    assert got.dtype == np.float64
    assert got.tolist() == [2.5] * 10 + [0.0] * 10 + [1.0, 0.0]
    tree.clear(np.array([0, 1, 20]))
    assert tree.total == 20.0 and tree.min == 2.5
    tree.update(np.array([], dtype=np.int64), np.array([]))
    assert tree.total == 20.0


@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000, 40_000, 300_001])
def test_from_leaves_round_trip(n: int) -> None:
    rng = np.random.default_rng(n)
    p = random_priorities(rng, n, zero_frac=0.2)
    p[0] = 0.5
    built = PriorityTree.from_leaves(p)
    updated = PriorityTree(n)
    perm = rng.permutation(n)
    updated.update(perm, np.ones(n))
    updated.update(perm, p[perm])
    for tree in (built, PriorityTree.from_leaves(built.state())):
        assert tree.state().dtype == np.float32
        assert np.array_equal(tree.state(), p)
        assert tree.total == pytest.approx(updated.total, rel=1e-12)
        assert tree.min == updated.min == p[p > 0].min()
        for a, b in zip(tree._sums, updated._sums, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12)
        for a, b in zip(tree._mins, updated._mins, strict=True):
            assert np.array_equal(a, b)
    if n >= 1000:
        assert built.nbytes / n <= 16  # budget; about 5.7 B/row at scale


def test_bulk_rebuild_10m_is_fast() -> None:
    p = np.random.default_rng(0).random(10_000_000, dtype=np.float32)
    t0 = time.perf_counter()
    tree = PriorityTree.from_leaves(p)
    elapsed = time.perf_counter() - t0
    assert elapsed < 3.0, elapsed
    assert tree.total == pytest.approx(p.sum(dtype=np.float64), rel=1e-9)
    assert tree.nbytes / p.size < 6.0


def test_errors() -> None:
    tree = PriorityTree(10)
    with pytest.raises(ValueError, match=r"priority.*nan"):
        tree.update(np.array([1]), np.array([np.nan]))
    with pytest.raises(ValueError, match=r"priority.*-1"):
        tree.update(np.array([1, 2]), np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"priority.*inf"):
        tree.update(np.array([1]), np.array([np.inf]))
    with pytest.raises(ValueError, match="priority"):
        tree.update(np.array([1]), np.array([1e39]))  # overflows float32
    with pytest.raises(ValueError, match=r"index 10 out of range"):
        tree.update(np.array([3, 10]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match=r"index -1 out of range"):
        tree.update(np.array([-1]), np.array([1.0]))
    with pytest.raises(ValueError, match="index"):
        tree.update(np.array([1.5]), np.array([1.0]))
    with pytest.raises(ValueError, match=r"index 11 out of range"):
        tree.get(np.array([11]))
    with pytest.raises(ValueError, match="priority has 2 values for 1"):
        tree.update(np.array([1]), np.array([1.0, 2.0]))
    assert tree.total == 0.0  # nothing was written by the failed calls
    with pytest.raises(ValueError, match="empty"):
        tree.sample(4, np.random.default_rng(0))
    tree.update(np.array([1]), np.array([1.0]))
    with pytest.raises(ValueError, match="NaN"):
        tree.find_prefix_sum(np.array([np.nan]))
    with pytest.raises(ValueError, match="priority"):
        PriorityTree.from_leaves(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="capacity"):
        PriorityTree(0)
