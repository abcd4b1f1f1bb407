"""Writing a stream of env steps so that no step loses its next observation.

The store keeps ``next_obs`` only where an episode ends (it is otherwise the next row's
``obs``). A stream from a training loop can break without saying so: SB3 resets the env
between two ``learn()`` calls, CleanRL passes only ``terminations`` as ``done``, a
recording ends mid-episode. :class:`StepWriter` therefore holds each lane's newest step
back until the lane's next step arrives. If that step continues the episode (its ``obs``
equals the held ``next_obs``) the held step is written as it is; otherwise it is written
as *truncated*, so its real ``next_obs`` lands in the episode's final row and the
transition bootstraps. :meth:`StepWriter.end` writes held steps the same way (on close).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..api import create
from ..api import open as open_store
from ..errors import SpecError, ValidationError
from ..storage.format import auto_shard_rows, stored_row_bytes
from ..store import Store
from ..validate import coerce

Step = dict[str, np.ndarray]  # flat field name -> array with leading axis T


class StepWriter:
    """One-step-late writer over a writable store (all of its lanes).

    ``checked=True``: every step given to :meth:`extend` is :meth:`coerce`'s output (or
    ``validate.coerce``'s, field by field), so it is stored without a second check
    (``Store.extend_checked``: full shards are written in the background).
    """

    def __init__(self, store: Any, checked: bool = False) -> None:
        self.store = store
        self.spec = store.spec
        self.checked = checked
        self.held: list[Step | None] = [None] * store.lanes
        #: steps written as truncated because the next step did not continue the episode
        self.breaks = 0

    # -- input ------------------------------------------------------------------------------
    def coerce(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
               truncated: Any, extras: Mapping[str, Any] | None = None,
               lead: tuple[int, ...] = (1,)) -> Step:
        """Check and cast one batch of steps (leading shape ``lead``); raises before storing."""
        spec = self.spec
        given = {**spec.flatten("obs", obs), **spec.flatten("action", action),
                 "reward": reward, "terminated": terminated, "truncated": truncated}
        extras = dict(extras or {})
        unknown = [k for k in extras if k not in spec.fields]
        if unknown:
            raise ValidationError(f"unknown field(s) {unknown}; the spec has {list(spec.fields)}")
        given.update(extras)
        out = {name: coerce(name, f, given.get(name), lead, spec.reject_nonfinite)
               for name, f in spec.fields.items()}
        for name, v in spec.flatten("obs", next_obs).items():
            out["next_" + name] = coerce("next_" + name, spec.fields[name], v, lead,
                                         spec.reject_nonfinite)
        return out

    # -- writing ----------------------------------------------------------------------------
    def extend(self, lane: int, steps: Step) -> None:
        """Append coerced steps (leading axis ``T``) to ``lane``; the newest one is held
        unless it ends its episode."""
        held = self.held[lane]
        if held is not None:
            steps = {k: np.concatenate([held[k], v]) for k, v in steps.items()}
        T = len(steps["reward"])
        if T > 1:
            done = steps["terminated"][:-1] | steps["truncated"][:-1]
            same = np.ones(T - 1, bool)
            for name in self.spec.obs_names:
                same &= _rows_equal(steps["next_" + name][:-1], steps[name][1:])
            cut = ~done & ~same
            if cut.any():
                steps["truncated"] = steps["truncated"].copy()
                steps["truncated"][:-1] |= cut
            self.breaks += int(cut.sum())
        if steps["terminated"][-1] or steps["truncated"][-1]:  # nothing to wait for
            self._write(lane, steps)
            self.held[lane] = None
            return
        if T > 1:
            self._write(lane, {k: v[:-1] for k, v in steps.items()})
        self.held[lane] = {k: np.array(v[-1:]) for k, v in steps.items()}

    def end(self, lanes: Any = None) -> None:
        """Write the held step of ``lanes`` (default all); unfinished episodes end truncated."""
        for lane in range(self.store.lanes) if lanes is None else np.atleast_1d(lanes):
            held = self.held[int(lane)]
            if held is None:
                continue
            held = dict(held)
            held["truncated"] = held["truncated"] | ~held["terminated"]
            self._write(int(lane), held)
            self.held[int(lane)] = None

    def _write(self, lane: int, steps: Step) -> None:
        if self.checked:  # (every break was closed above: the store need not compare)
            self.store.extend_checked(lane, steps, check_next_obs=False)
            return
        spec = self.spec
        batch: dict[str, Any] = {"obs": _unflatten(spec, "obs", steps),
                                 "next_obs": _unflatten(spec, "obs", steps, "next_"),
                                 "action": _unflatten(spec, "action", steps)}
        for name in spec.fields:
            if name not in spec.obs_names and name not in spec.action_names:
                batch[name] = steps[name]
        self.store.extend(batch, lane=lane)


#: bytes of rows (all fields) in one shard up to which an integration's store takes shards
#: of up to 4096 rows (frames: 1024)
SMALL_SHARD_BYTES = 4 << 20


def default_shard_rows(spec: Any, capacity: int, lanes: int = 1) -> int:
    """Rows per shard of a store an integration creates: the largest power of two that
    leaves at least 8 shards per lane, at most 4096 rows where such a shard of rows (all
    fields) stays within :data:`SMALL_SHARD_BYTES`, else at most 1024 (frames: a 4096-row
    shard of Atari frames, 7 KB a row, is 28 MB per staging buffer); the store's own default
    (``auto_shard_rows``: more rows past 4,096 shards) where that is larger and within
    :data:`SMALL_SHARD_BYTES`.

    Every shard is a file per field to write (created, written, fsynced, renamed), so a
    writer taking small rows as fast as it can is bound by shards per second: at 50k
    CartPole transitions the TorchRL bridge's drained ``extend`` was 1.7-2.7x
    ``LazyTensorStorage``'s with 1024-row shards and 1.1-1.4x with 4096 (benchmarks/
    RESULTS.md, "Issue 26: read path, status"). What a larger shard costs: a lane stages a
    shard's rows in RAM, and a partial flush (``flush()`` mid-shard) drops the old lap's
    rows of the whole shard until the writer passes them; loaders keep a shard ahead of a
    writer clear. At 8 shards per lane either is at most 1/8 of the ring; full shards
    written behind the writer drop nothing early."""
    per_lane = max(-(-int(capacity) // lanes), 2)
    row_bytes = stored_row_bytes(spec)
    fits = 1 << max(0, (SMALL_SHARD_BYTES // max(1, row_bytes)).bit_length() - 1)
    cap = max(1024, min(4096, fits))
    rows = int(min(cap, max(1, 2 ** int(np.log2(max(per_lane // 8, 1))))))
    auto = auto_shard_rows(int(capacity), int(lanes), row_bytes)
    return auto if auto > rows and auto * row_bytes <= SMALL_SHARD_BYTES else rows


def open_or_create(url: Any, spec: Any, capacity: int, lanes: int = 1,
                   shard_rows: int | None = None, overwrite: bool = False,
                   storage_options: dict[str, Any] | None = None, fsync: bool = True) -> Any:
    """A writable store at ``url``: opened (spec checked) if one is there, else created.

    ``url`` may also be an open :class:`~expstore.Store`. A new store holds at least
    ``capacity`` rows at every moment: a lane's writer drops the old lap's rows of a whole
    shard when it enters it, so the ring gets one shard per lane more than ``capacity``,
    rounded up to whole shards (50,000 rows in 4096-row shards: 57,344 made, 53,248 to
    57,344 held once it wraps; ``store.layout.requested_capacity`` records ``capacity``).
    ``shard_rows`` defaults to :func:`default_shard_rows`.
    """
    if isinstance(url, Store):
        store = url
        if not store.spec.same_as(spec):
            raise SpecError(f"{store.url}: store spec differs from the one these spaces need: "
                            + "; ".join(store.spec.diff(spec)))
    elif overwrite:
        store = None
    else:
        try:
            store = open_store(url, mode="r+", spec=spec, storage_options=storage_options,
                         fsync=fsync)
        except FileNotFoundError:
            store = None
    if store is None:
        rows = shard_rows or default_shard_rows(spec, capacity, lanes)
        store = create(url, spec, int(capacity), lanes=lanes, shard_rows=rows,
                       overwrite=overwrite, storage_options=storage_options, fsync=fsync,
                       headroom_rows=rows)
    if store.lanes != lanes:
        raise SpecError(f"{store.url}: store has {store.lanes} lane(s) but {lanes} env(s) write "
                        "to it (one lane per env); use another url or overwrite=True")
    if store.mode == "r":
        raise ValidationError(f"{store.url}: store is open read-only; open it with mode='r+'")
    return store


def _unflatten(spec: Any, prefix: str, steps: Step, pre: str = "") -> Any:
    st = spec.structure.get(prefix, {"kind": "single"})
    if st["kind"] == "single":
        return steps[pre + prefix]
    return {k: steps[f"{pre}{prefix}.{k}"] for k in st["keys"]}


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per leading index, whether two arrays are equal everywhere (NaN equals NaN)."""
    eq = a == b
    if a.dtype.kind == "f":
        eq |= np.isnan(a) & np.isnan(b)
    return eq.reshape(len(a), -1).all(axis=1)


def index_tree(tree: Any, i: Any) -> Any:
    """``tree[i]`` for an array, or leaf-wise for a dict / tuple of arrays."""
    if isinstance(tree, Mapping):
        return {k: index_tree(v, i) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(index_tree(v, i) for v in tree)
    return np.asarray(tree)[i]
