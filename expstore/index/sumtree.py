"""Vectorized sum-tree / min-tree priority index for prioritized experience replay (pure numpy)."""

from __future__ import annotations

import numpy as np

__all__ = ["PriorityTree"]

_F32_MAX = float(np.finfo(np.float32).max)
_SHIFT = 3
_B = 1 << _SHIFT  # fanout 8: 8 float64 sums are one 64 B cache line, 8 bools one uint64
_U9 = np.zeros((_B, _B + 1))  # rows @ _U9 -> [0, c0, c0+c1, ...] (exclusive + inclusive prefix)
_U9[np.triu_indices(_B)[0], np.triu_indices(_B)[1] + 1] = 1.0
_ONES = np.ones(_B)


def _count_true_rows(m: np.ndarray) -> np.ndarray:
    """Number of True per row of a contiguous (k, 8) bool array."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2: the 8 bools of a row are one uint64
        return np.bitwise_count(m.view(np.uint64)).ravel()
    return np.count_nonzero(m, axis=1)


class PriorityTree:
    """Sum-tree plus min-tree over ``capacity`` leaves (row indices ``0..capacity-1``).

    Layout: an implicit 8-ary tree stored level by level. Leaf priorities are float32
    (4 B/row); each internal level holds the float64 sums and float32 minima of blocks of 8
    children, so internal nodes cost ``12 / 7`` ≈ 1.7 B/row: about **5.7 B/row** in total
    (see :attr:`nbytes`). Levels above the first one with at most ``TOP`` nodes are not
    stored: that top level is scanned with ``cumsum`` + ``searchsorted`` instead, so a
    10M-row tree needs 4 block descents per draw.

    Internal sums are recomputed from their children on every update (never updated by
    deltas), so they do not drift: ``total`` is the float64 sum of the float32 leaves.
    A leaf with priority 0 is "not present": it is never sampled and counts as ``+inf``
    for :attr:`min`. Priorities are stored as float32; a positive priority smaller than
    the smallest float32 subnormal (~1.4e-45) rounds to 0. All methods are vectorized:
    ``O(k log n)`` numpy work for ``k`` indices, one Python iteration per level.
    """

    TOP = 4096

    def __init__(self, capacity: int) -> None:
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._leaves = np.zeros(-(-capacity // _B) * _B, dtype=np.float32)
        sizes: list[int] = []
        m = self._leaves.size // _B
        while m > self.TOP:
            m = -(-m // _B) * _B  # pad so that every non-top level reshapes to (-1, 8)
            sizes.append(m)
            m //= _B
        sizes.append(m)
        # level 0 = parents of the leaves, level -1 = the top level (<= TOP nodes)
        self._sums = [np.zeros(s, dtype=np.float64) for s in sizes]
        self._mins = [np.full(s, np.inf, dtype=np.float32) for s in sizes]
        # (nodes/8, 8) views: row p holds the 8 children of node p of the level above
        self._sums2d = [a.reshape(-1, _B) for a in self._sums[:-1]]
        self._mins2d = [a.reshape(-1, _B) for a in self._mins[:-1]]
        self._leaves2d = self._leaves.reshape(-1, _B)

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> int:
        """Number of rows (leaves)."""
        return self._capacity

    def __len__(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Bytes held by the leaf and internal-node arrays."""
        return self._leaves.nbytes + sum(a.nbytes for a in self._sums + self._mins)

    @property
    def total(self) -> float:
        """Sum of all leaf priorities (float64)."""
        return float(np.add.accumulate(self._sums[-1])[-1])  # same order as sampling

    @property
    def min(self) -> float:
        """Smallest nonzero leaf priority; ``inf`` if no leaf is present."""
        return float(self._mins[-1].min())

    # ------------------------------------------------------------------ validation
    def _check_index(self, index: np.ndarray) -> np.ndarray:
        idx = np.asarray(index)
        if idx.dtype.kind not in "iu":
            if idx.size == 0:
                return np.zeros(0, dtype=np.int64)
            raise ValueError(f"index must be an integer array, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False).ravel()
        if idx.size and (np.minimum.reduce(idx) < 0 or np.maximum.reduce(idx) >= self._capacity):
            self._raise_index(idx)
        return idx

    def _raise_index(self, idx: np.ndarray) -> None:
        bad = idx[(idx < 0) | (idx >= self._capacity)][0]
        raise ValueError(f"index {bad} out of range [0, {self._capacity})")

    @staticmethod
    def _check_priority(pri: np.ndarray) -> None:
        if pri.size and not (np.minimum.reduce(pri) >= 0 and np.maximum.reduce(pri) <= _F32_MAX):
            bad = pri[~((pri >= 0) & (pri <= _F32_MAX))][0]
            raise ValueError(f"priority must be finite, >= 0 and fit float32, got {bad}")

    # ------------------------------------------------------------------ updates
    def update(self, index: np.ndarray, priority: np.ndarray | float) -> None:
        """Set ``priority[i]`` at leaf ``index[i]``; for duplicate indices the last one wins."""
        idx = np.asarray(index)
        if idx.dtype.kind not in "iu":
            idx = self._check_index(idx)  # raises unless empty
        idx = idx.astype(np.int64, copy=False).ravel()
        pri = np.asarray(priority)
        if pri.dtype.kind != "f":
            pri = pri.astype(np.float64)
        if pri.ndim == 0:
            pri = np.broadcast_to(pri, idx.shape)
        else:
            pri = pri.ravel()
            if pri.size != idx.size:
                raise ValueError(f"priority has {pri.size} values for {idx.size} indices")
        self._check_priority(pri)
        if idx.size == 0:
            return
        # sort (stable: equal keys keep their order) for the range check, duplicate
        # detection and a cache-friendly propagation order
        order = np.argsort(idx, kind="stable")
        idx = idx.take(order)
        if idx[0] < 0 or idx[-1] >= self._capacity:
            self._raise_index(idx)
        dup = idx[1:] == idx[:-1]
        if dup.any():  # keep the last occurrence of each run of equal indices
            keep = np.append(~dup, True)
            idx, order = idx[keep], order[keep]
        self._leaves[idx] = pri.take(order)
        self._propagate(idx)

    def clear(self, index: np.ndarray) -> None:
        """Set the given leaves to priority 0 (not present)."""
        self.update(index, 0.0)

    def _propagate(self, node: np.ndarray) -> None:
        """Recompute all ancestors of the (sorted, unique) leaves ``node``, level by level."""
        for lvl, (sums, mins) in enumerate(zip(self._sums, self._mins, strict=True)):
            node = node >> _SHIFT
            if lvl == 0:
                rows = self._leaves2d.take(node, axis=0)
                s = rows.astype(np.float64) @ _ONES
                rows_t = rows.T.copy()  # (8, k): reductions over axis 0 vectorize well
                rows_t[rows_t == 0] = np.inf
            else:
                s = self._sums2d[lvl - 1].take(node, axis=0) @ _ONES
                rows_t = self._mins2d[lvl - 1].take(node, axis=0).T.copy()
            sums[node] = s
            mins[node] = np.minimum.reduce(rows_t, axis=0)

    # ------------------------------------------------------------------ queries
    def get(self, index: np.ndarray) -> np.ndarray:
        """Leaf priorities at ``index`` as float64."""
        return self._leaves.take(self._check_index(index)).astype(np.float64)

    def find_prefix_sum(self, values: np.ndarray) -> np.ndarray:
        """For each prefix mass ``v`` return the leaf ``i`` with ``cum[i-1] <= v < cum[i]``.

        ``values`` are clamped to ``[0, total]``; the result is always a leaf with nonzero
        priority (rounding at segment edges falls back to the nearest nonzero sibling on
        the left). Raises ``ValueError`` if the tree is empty or a value is NaN.
        """
        v = np.array(values, dtype=np.float64).ravel()
        if np.isnan(v).any():
            raise ValueError("values must not be NaN")
        return self._search(v, None)

    def sample(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """Stratified proportional sampling: one uniform draw per ``total / batch_size`` segment.

        Returns ``batch_size`` int64 leaf indices, each with nonzero priority.
        """
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {batch_size}")
        return self._search(rng.random(batch_size), batch_size)

    def _search(self, v: np.ndarray, strata: int | None) -> np.ndarray:
        top = np.empty(self._sums[-1].size + 1)
        top[0] = 0.0
        np.add.accumulate(self._sums[-1], out=top[1:])
        total = top[-1]
        if not total > 0.0:
            raise ValueError("cannot search an empty tree (total priority is 0)")
        if v.size == 0:
            return np.zeros(0, dtype=np.int64)
        if strata is None:
            np.clip(v, 0.0, total, out=v)  # NaN was rejected by the caller
        else:  # v holds uniforms in [0, 1): map draw i into segment i of ``strata``
            v += np.arange(strata)
            v *= total / strata  # may round up to > total: handled like v == total
        node = self._descend(v.copy(), top, fast=True)
        if not self._leaves.take(node).all():
            # only if matmul prefix sums were not monotone: redo those exactly
            bad = self._leaves.take(node) == 0
            node[bad] = self._descend(v[bad], top, fast=False)
        return node

    def _descend(self, v: np.ndarray, top: np.ndarray, fast: bool) -> np.ndarray:
        """Top-down search for masses ``v`` in [0, total] (consumed in place).

        With monotone prefix sums, ``j = #(prefix <= v) < 8`` implies child ``j`` has nonzero
        mass; ``j == 8`` (v reached the block total by rounding) is clamped to the last
        nonzero child, which exists because the current node's sum is > 0. ``fast`` uses a
        BLAS matmul for the prefix sums, otherwise a sequential (monotone) ``cumsum``.
        """
        node = np.searchsorted(top[1:], v, side="right")
        if np.maximum.reduce(node) == top.size - 1:
            node[node == top.size - 1] = np.flatnonzero(self._sums[-1])[-1]
        v -= top.take(node)
        k = v.size
        rowbase = np.arange(0, k * (_B + 1), _B + 1)
        vcol = v[:, None]
        for lvl in range(len(self._sums) - 1, -1, -1):
            if lvl:
                rows = self._sums2d[lvl - 1].take(node, axis=0)
            else:
                rows = self._leaves2d.take(node, axis=0).astype(np.float64)
            if fast:
                cs = rows @ _U9
            else:
                cs = np.zeros((k, _B + 1))
                np.cumsum(rows, axis=1, out=cs[:, 1:])
            j = _count_true_rows(cs[:, 1:] <= vcol)  # number of inclusive prefixes <= v
            if np.maximum.reduce(j) == _B:
                over = j == _B
                j[over] = (_B - 1) - np.argmax(rows[over][:, ::-1] > 0, axis=1)
            v -= cs.take(rowbase + j)
            node <<= _SHIFT
            node += j
        return node

    # ------------------------------------------------------------------ persistence
    def state(self) -> np.ndarray:
        """Copy of the leaf priorities, float32, shape ``(capacity,)``."""
        return self._leaves[: self._capacity].copy()

    @classmethod
    def from_leaves(cls, leaves: np.ndarray) -> PriorityTree:
        """Build a tree from leaf priorities in O(n), bottom-up, one numpy pass per level."""
        arr = np.asarray(leaves)
        if arr.ndim != 1:
            raise ValueError(f"leaves must be 1-D, got shape {arr.shape}")
        cls._check_priority(arr)
        tree = cls(arr.size)
        tree._leaves[: arr.size] = arr
        rows = tree._leaves.reshape(-1, _B)
        s = rows.astype(np.float64) @ _ONES
        m = np.where(rows > 0, rows, np.float32(np.inf)).min(axis=1)
        for lvl, (sums, mins) in enumerate(zip(tree._sums, tree._mins, strict=True)):
            sums[: s.size] = s
            mins[: m.size] = m
            if lvl + 1 < len(tree._sums):
                s = sums.reshape(-1, _B) @ _ONES
                m = mins.reshape(-1, _B).min(axis=1)
        return tree
