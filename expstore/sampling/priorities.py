"""Row priorities for prioritized sampling, kept in step with the index and the store.

A :class:`PriorityIndex` holds one :class:`~expstore.index.sumtree.PriorityTree` leaf per
row of the store (``p = (|δ| + eps) ** alpha``; 0 = not sampleable). It listens to the
:class:`~expstore.index.rows.RowIndex`: rows that appear get the running maximum priority,
rows dropped by wrap-around get 0. ``update`` ignores rows that are gone or, given their
``step_id``, were overwritten since they were sampled.

Priorities persist with the store: ``save()`` writes one object ``_index/<name>.bin``
(atomically, with ``backend.put``) and runs on every ``store.flush()`` (so on ``close()``);
a sampler made on a reopened store loads it back. Rows written after the save get the
maximum priority, rows dropped since get 0.
"""

from __future__ import annotations

import json
import struct
import warnings
import weakref
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ReadOnlyError, StoreCorruptError
from ..index.rows import NO_ANCHOR
from ..index.sumtree import PriorityTree
from ..storage.layout import FLAG_FIRST
from .base import NotEnoughData

MAGIC = b"EXPRIO01"
FORMAT_VERSION = 1
_PIECE = 1 << 24  # float32 values per compressed piece (64 MiB; blosc limit is 2 GiB)
_F32_MAX = float(np.finfo(np.float32).max)

Accept = Callable[[np.ndarray], np.ndarray]  # rows -> bool mask of rows that carry priority


def priority_key(name: str) -> str:
    """Object key of the persisted priorities called ``name``."""
    return f"_index/{name}.bin"


def to_numpy(x: Any, dtype: Any = None) -> np.ndarray:
    """A numpy array from numpy/lists/torch tensors (any device)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


class BetaSchedule:
    """Importance-sampling exponent per batch: constant ``beta``, linear from ``beta`` to
    ``beta_final`` over ``beta_steps`` batches, or ``schedule(batches_drawn) -> beta``."""

    def __init__(self, beta: float = 0.4, beta_final: float = 1.0, beta_steps: int | None = None,
                 schedule: Callable[[int], float] | None = None) -> None:
        for name, v in (("beta", beta), ("beta_final", beta_final)):
            if not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"{name}: expected 0..1, got {v}")
        if beta_steps is not None and int(beta_steps) < 1:
            raise ValueError(f"beta_steps: expected >= 1, got {beta_steps}")
        self.beta0 = float(beta)
        self.beta_final = float(beta_final)
        self.beta_steps = beta_steps
        self.schedule = schedule

    def __call__(self, n: int) -> float:
        if self.schedule is not None:
            b = float(self.schedule(n))
            if not 0.0 <= b <= 1.0:
                raise ValueError(f"beta schedule returned {b} at batch {n}; expected 0..1")
            return b
        if self.beta_steps is None:
            return self.beta0
        frac = min(1.0, n / self.beta_steps)
        return self.beta0 + frac * (self.beta_final - self.beta0)


class PriorityIndex:
    """Priorities of the rows of ``store`` for one sampler.

    ``accept(rows)`` says which non-final rows carry a priority (all of them for
    transitions; sequence starts for sequences); ``kind`` names that rule in the saved file
    so a sampler with another rule does not load it. ``lag``: a row gets its priority only
    once ``lag`` rows follow it (a transition's next row), so the newest row of a lane,
    which cannot be sampled yet, does not draw samples that would be rejected.
    """

    def __init__(self, store: Any, alpha: float = 0.6, eps: float = 1e-6,
                 name: str = "priorities", accept: Accept | None = None,
                 kind: str = "transition", persist: bool = True, load: bool = True,
                 lag: int = 0) -> None:
        if not alpha >= 0.0:
            raise ValueError(f"alpha: expected >= 0, got {alpha}")
        if not eps >= 0.0:
            raise ValueError(f"eps: expected >= 0, got {eps}")
        self.store = store
        self.index = store.index
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.name = name
        self.kind = kind
        self.accept = accept
        self.persist = persist
        self.lag = int(lag)
        self.max_priority = 1.0  # running max of leaves, in p**alpha units
        self.dirty = True
        saved = self._load() if (load and persist and hasattr(store, "backend")) else None
        self._tree = self._fill(saved)
        self._pending: list[np.ndarray] = []  # rows added since, awaiting max priority
        ref = weakref.ref(self)
        index = self.index

        def listener(kind: str, rows: np.ndarray) -> None:
            me = ref()
            if me is None:
                index.unsubscribe(listener)
            else:
                me._on_rows(kind, rows)

        self._listener = listener
        index.subscribe(listener)
        self._hook: Callable[[], None] | None = None
        if persist and hasattr(store, "add_flush_hook"):
            def hook() -> None:
                me = ref()
                if me is None:
                    store.remove_flush_hook(hook)
                elif store.mode != "r":
                    me.save()

            self._hook = hook
            store.add_flush_hook(hook)

    # -- membership ------------------------------------------------------------------------
    def _accepted(self, rows: np.ndarray) -> np.ndarray:
        ok = (self.index.flags[rows] & NO_ANCHOR) == 0  # final and lost rows: never
        if self.accept is not None:
            ok &= self.accept(rows)
        return ok

    @property
    def tree(self) -> PriorityTree:
        """The sum/min tree, with every row added so far at the maximum priority."""
        if self._pending:
            rows = np.concatenate(self._pending)
            self._pending.clear()
            self._tree.update(rows, self.max_priority)
        return self._tree

    @tree.setter
    def tree(self, tree: PriorityTree) -> None:
        self._pending.clear()
        self._tree = tree

    def _on_rows(self, kind: str, rows: np.ndarray) -> None:
        # Added rows are queued and enter the tree in one update before its next use: one
        # tree update per batch instead of one per env step.
        if kind == "added":
            if self.lag:
                rows = self._ready(rows)
            rows = rows[self._accepted(rows)]
            if len(rows):
                self._pending.append(rows)
        elif kind == "dropped":
            self.tree.clear(rows)
        self.dirty = True

    def _ready(self, rows: np.ndarray) -> np.ndarray:
        """Of rows just added (one lane's, in step order), those with ``lag`` rows written
        after them, plus the rows before them that waited for their successors (if of the
        same episode)."""
        idx = self.index
        L = idx.lane_capacity
        lane = int(rows[0]) // L
        count = int(idx.count[lane])
        steps = idx.steps(rows)
        ready = rows[steps + self.lag < count]
        first = int(steps[0])  # (a final row not announced may come just before it)
        lo = max(first - self.lag - 1, int(idx.lower_bound(0)[lane]))
        if lo >= first:
            return ready
        if self.lag == 1:  # the common case, per env step: plain Python on two rows
            flags, leaves = idx.flags, self._tree
            prev = [lane * L + t % L for t in range(lo, first)
                    if not flags[lane * L + (t + 1) % L] & FLAG_FIRST]
            prev = np.array(prev, np.int64)
            prev = prev[leaves.get(prev) == 0] if len(prev) else prev
        else:
            prev = idx.lane_rows(lane, np.arange(lo, first))
            # (a row still waiting has priority 0 and is never queued)
            prev = prev[(self._tree.get(prev) == 0) & (idx.horizon(prev, self.lag)[1] > 0)]
        return np.concatenate([ready, prev]) if len(prev) else ready

    def live_rows(self, lane: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``lane`` that are intact now, and their steps (oldest first)."""
        idx = self.index
        steps = np.arange(int(idx.lower_bound(0)[lane]), int(idx.count[lane]), dtype=np.int64)
        return idx.lane_rows(lane, steps), steps

    def _fill(self, saved: dict[str, Any] | None) -> PriorityTree:
        """A tree with a leaf for every intact row: the saved priority where still valid,
        else the maximum."""
        leaves = np.zeros(self.index.capacity, np.float32)
        if saved is not None:
            self.max_priority = float(saved["max_priority"])
        L = self.index.lane_capacity
        for lane in range(self.index.lanes):
            rows, steps = self.live_rows(lane)
            if not len(rows):
                continue
            acc = self._accepted(rows) & (steps + self.lag < self.index.count[lane])
            val = np.full(len(rows), self.max_priority, np.float32)
            if saved is not None:
                s_count = int(saved["count"][lane])
                s_lo = max(int(saved["valid_from"][lane]), s_count - L)
                old = saved["leaves"][rows]
                same = (steps >= s_lo) & (steps < s_count) & (old > 0)
                val[same] = old[same]
            leaves[rows] = np.where(acc, val, 0)
        return PriorityTree.from_leaves(leaves)

    # -- updates ---------------------------------------------------------------------------
    def priority(self, td_error: Any) -> np.ndarray:
        """``(|td_error| + eps) ** alpha`` as float64 (raises on NaN/inf)."""
        td = np.abs(to_numpy(td_error, np.float64)).ravel()
        if not np.isfinite(td.sum()):  # one reduction: a NaN or inf makes the sum one
            bad = td[~np.isfinite(td)][0]
            raise ValueError(f"td_error: expected finite values, got {bad}")
        return (td + self.eps) ** self.alpha

    def update(self, rows: Any, td_error: Any, step_id: Any = None) -> int:
        """Set priorities of ``rows`` from ``|td_error|``; returns how many were applied.

        Rows no longer held (dropped, final, never written) are skipped, and so are rows
        whose current step differs from ``step_id`` (overwritten since they were sampled).
        """
        rows = to_numpy(rows, np.int64).ravel()
        p = self.priority(td_error)
        if p.size != rows.size:
            raise ValueError(f"td_error: expected {rows.size} values (one per index), "
                             f"got {p.size}")
        keep = self.tree.get(rows) > 0  # (raises on rows out of range)
        if step_id is not None:
            sid = to_numpy(step_id, np.int64).ravel()
            if sid.size != rows.size:
                raise ValueError(f"step_id: expected {rows.size} values, got {sid.size}")
            keep &= self.index.steps(rows) == sid
        n = int(keep.sum())
        if n:
            if n < rows.size:
                rows, p = rows[keep], p[keep]
            top = float(p.max())
            if top > _F32_MAX:
                np.minimum(p, _F32_MAX, out=p)
                top = _F32_MAX
            self.tree.update(rows, p)
            self.max_priority = max(self.max_priority, top)
            self.dirty = True
        return n

    def clear(self, rows: np.ndarray) -> None:
        """Take ``rows`` out of sampling (they can never serve the sampler's need)."""
        if len(rows):
            self.tree.clear(rows)
            self.dirty = True

    # -- sampling --------------------------------------------------------------------------
    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` rows, stratified proportional to priority."""
        try:
            return self.tree.sample(n, rng)
        except ValueError as e:  # an empty tree
            raise NotEnoughData("no row has a priority yet (the store holds no sampleable "
                                "rows)") from e

    def weights(self, rows: np.ndarray, beta: float | np.ndarray) -> np.ndarray:
        """Importance weights ``(N P(i))^-beta / max_w = (p_i / p_min)^-beta`` (float32;
        ``beta``: one exponent, or one per row)."""
        p = self.tree.get(rows)
        w = (p / self.tree.min) ** (-beta)
        return w.astype(np.float32)

    # -- persistence -----------------------------------------------------------------------
    @property
    def key(self) -> str:
        return priority_key(self.name)

    def save(self, force: bool = False) -> bool:
        """Write the priorities under the store root; ``False`` if nothing changed.

        One object of ``4 * capacity`` bytes before compression (blosc-lz4, byte-shuffled),
        replaced atomically: call it (or ``store.flush()``) at checkpoint cadence.
        """
        st = self.store
        if getattr(st, "mode", "r+") == "r":
            raise ReadOnlyError(f"{st.url}: store opened read-only; priorities cannot be "
                                "saved (open with mode='r+')")
        if not (self.dirty or force):
            return False
        leaves = self.tree.state()
        import numcodecs

        codec = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
        pieces = [codec.encode(leaves[i:i + _PIECE]) for i in range(0, len(leaves), _PIECE)]
        payload = b"".join(pieces)
        header = {
            "version": FORMAT_VERSION, "name": self.name, "kind": self.kind,
            "alpha": self.alpha, "eps": self.eps, "max_priority": self.max_priority,
            "capacity": int(self.index.capacity), "lanes": int(self.index.lanes),
            "count": self.index.count.tolist(), "valid_from": self.index.valid_from.tolist(),
            "pieces": [len(b) for b in pieces], "crc32": zlib.crc32(payload),
        }
        head = json.dumps(header).encode()
        st.backend.put(self.key, MAGIC + struct.pack("<I", len(head)) + head + payload)
        self.dirty = False
        return True

    def _load(self) -> dict[str, Any] | None:
        backend = self.store.backend
        raw = backend.get(self.key)
        if raw is None:
            return None
        where = f"{backend.url}/{self.key}"
        try:
            if raw[:8] != MAGIC:
                raise ValueError("bad magic bytes")
            (n,) = struct.unpack("<I", raw[8:12])
            header = json.loads(raw[12:12 + n])
            payload = memoryview(raw)[12 + n:]
        except (ValueError, struct.error) as e:
            raise StoreCorruptError(f"{where}: not an expstore priority file ({e})") from e
        if header.get("version", 0) > FORMAT_VERSION:
            raise StoreCorruptError(f"{where}: priority format version {header['version']} is "
                                    f"newer than this expstore reads ({FORMAT_VERSION})")
        if zlib.crc32(payload) != header.get("crc32"):
            raise StoreCorruptError(f"{where}: priority file fails its checksum")
        if header["capacity"] != self.index.capacity or header["lanes"] != self.index.lanes:
            raise StoreCorruptError(
                f"{where}: saved for capacity {header['capacity']} / {header['lanes']} lanes, "
                f"the store has {self.index.capacity} / {self.index.lanes}")
        if header.get("kind") != self.kind:
            warnings.warn(f"{where}: saved priorities are for {header.get('kind')!r} sampling, "
                          f"this sampler needs {self.kind!r}; starting from max priority",
                          stacklevel=3)
            return None
        import numcodecs

        codec = numcodecs.Blosc()
        parts, at = [], 0
        for size in header["pieces"]:
            parts.append(np.frombuffer(codec.decode(payload[at:at + size]), np.float32))
            at += size
        leaves = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        if leaves.size != self.index.capacity:
            raise StoreCorruptError(f"{where}: holds {leaves.size} priorities, expected "
                                    f"{self.index.capacity}")
        old_alpha = float(header["alpha"])
        max_p = float(header["max_priority"])
        if old_alpha != self.alpha:  # convert p**old_alpha to p**alpha
            if old_alpha > 0:
                r = self.alpha / old_alpha
                leaves = (leaves.astype(np.float64) ** r).astype(np.float32)
                max_p = max_p ** r
            else:
                leaves = np.zeros_like(leaves)  # alpha 0 kept no information: all max
                max_p = 1.0
        header.update(leaves=leaves, max_priority=max_p)
        return header

    def detach(self) -> None:
        """Stop listening to the index and to flushes."""
        self.index.unsubscribe(self._listener)
        if self._hook is not None:
            self.store.remove_flush_hook(self._hook)
            self._hook = None

    @property
    def nbytes(self) -> int:
        return int(self._tree.nbytes)
