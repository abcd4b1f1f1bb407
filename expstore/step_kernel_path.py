"""The appender's C paths: one env step (one lane, or one step in every lane) checked and
staged by one call of the native step kernel (``storage.write.build_plan``); and the rows
of a batch of steps with final rows between them in one call (:func:`encode_steps`).

Where the C kernel was built and the spec is one it stages (``storage/write/step_plan.py``),
:meth:`StepKernelPath.add` stages the same rows as the Python paths of
:class:`~expstore.appender.Appender` (``add_one``/``add_lanes``): the step's row, its final
row, the index entries and the lane's held ``next_obs``. It hands back (``False``) a step it
does not take as is (a value to cast, clip or refuse, a stream break, a failed shard write
waiting). A lane whose row opens a shard, or whose shard fills, is moved to its next shard
buffer inside the call in the common case (``step_shards.h``, the fast path of
``LaneWriter._enter_shard`` / ``_hand_off``); the lanes it leaves are moved by their writers
between two kernel calls (:meth:`StepKernelPath._moved`). The appender owns the state both
paths share (the lanes' writers, the index, ``open_step``, ``held_ok``/``held_vals``, the
staging table ``LaneRows``); this module holds references to it, never copies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import WriteFailedError
from .rows import FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED
from .rows import encode_steps as encode_steps_numpy
from .storage.native import write_kernel
from .storage.write import FORKS, LaneRows, build_plan

_UNBUILT = object()


def encode_steps(values: dict[str, np.ndarray], names: list[str], open_episode_step: int,
                 first_step: int = 0, ends: np.ndarray | None = None
                 ) -> tuple[dict[str, np.ndarray], int, int]:
    """:func:`expstore.rows.encode_steps` (same arguments, same rows), by one call of the
    write kernel where a final row falls in the batch: numpy took about a dozen calls per
    field there (~130 µs for 100 CartPole steps, against ~15 without a final row, where
    the values are the rows as they are)."""
    kernel = write_kernel()
    term, trunc = values["terminated"], values["truncated"]
    done = (term | trunc) if ends is None else ends
    n_final = int(np.count_nonzero(done))
    if kernel is None or n_final == 0:  # (``done`` as ``ends``: the same rows)
        return encode_steps_numpy(values, names, open_episode_step, first_step, done)
    n_rows = len(done) + n_final
    srcs = tuple(np.ascontiguousarray(values[n]) for n in names)
    nexts = tuple(None if (v := values.get("next_" + n)) is None else np.ascontiguousarray(v)
                  for n in names)
    rows = {n: np.empty((n_rows, *v.shape[1:]), v.dtype) for n, v in zip(names, srcs)}
    ep, flags = np.empty(n_rows, np.int32), np.empty(n_rows, np.uint8)
    next_open = kernel.step_rows(srcs, nexts, tuple(rows.values()),
                                 np.ascontiguousarray(term, bool),
                                 np.ascontiguousarray(trunc, bool),
                                 np.ascontiguousarray(done, bool), ep, flags,
                                 open_episode_step)
    rows["_episode_step"], rows["_flags"] = ep, flags
    rows["_step_id"] = np.arange(first_step, first_step + n_rows, dtype=np.int64)
    return rows, next_open, n_final


@dataclass(eq=False, repr=False)
class StepKernelPath:
    """One step by one C call, for the appender of one store.

    ``writers`` (lane -> LaneWriter) and ``index`` (RowIndex) are the appender's;
    ``table()`` gives its staging table (made at first use); ``open_step``, ``held_ok`` and
    ``held_obs`` (the held ``next_obs`` of the first obs field, one row per lane) are its
    arrays, read and written in place by the kernel. ``add_one`` is the appender's Python
    path for one step of one lane: it stages the final rows that open a lane's next shard.
    """

    spec: Any
    writers: dict[int, Any]
    index: Any
    table: Callable[[], LaneRows]
    open_step: np.ndarray
    held_ok: np.ndarray
    held_obs: np.ndarray
    add_one: Callable[..., None]
    lane_rows: LaneRows | None = field(default=None, init=False)  # table(), with the plan
    _plan: Any = field(default=_UNBUILT, init=False)  # the C kernel's plan (first plan())

    def plan(self) -> Any:
        """The C kernel's plan of this store (``storage.write.step_plan.build_plan``; ``None``:
        the kernel is not built or does not stage this spec), made at the first call."""
        if self._plan is _UNBUILT:
            idx = self.index
            self.lane_rows = self.table()
            self._plan = build_plan(self.spec, self.lane_rows, self.open_step, self.held_ok,
                                    self.held_obs, idx.episode_step, idx.flags, idx.count,
                                    idx.valid_from, idx.committed, idx.lane_capacity,
                                    (FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED))
        return self._plan

    def add(self, lane: int, obs: Any, action: Any, reward: Any, next_obs: Any,
            terminated: Any, truncated: Any) -> bool:
        """Stage one step of ``lane`` (``-1``: one step in every lane, values with leading
        axis ``lanes``) with one C call: the rows ``Appender.add_one`` (``add_lanes``) would
        stage. ``False``: nothing was staged; the caller takes the general path."""
        plan = self._plan if self._plan is not _UNBUILT else self.plan()
        idx = self.index
        if plan is None or idx._listeners:  # (listeners hear rows from the Python paths)
            return False
        table = self.lane_rows
        if table.stale:
            table.reload()
        w = table.writers[lane]  # (lane -1: any lane; all are written here)
        if w is None or w.forks != FORKS[0]:
            return False  # the general path names the problem
        step = (lane, obs, action, reward, next_obs, terminated, truncated)
        got = plan.add(*step)
        if got is None:
            idx.last_lane = plan.last_lane
            return True
        if got is False:
            return False
        if got[0] == 1:  # lanes whose next row opens a shard: open them, then stage
            for j in got[1]:
                self._moved(j, table, enter=True)
            got = plan.add(*step)
            if got is None:
                idx.last_lane = plan.last_lane
                return True
            if got is False:  # (the Python path takes the shards as opened)
                return False
        errors = []
        for j in got[1]:  # full shards: to the background writer
            try:
                self._moved(j, table, enter=False)
            except WriteFailedError as e:  # staged; a shard write failed
                errors.append(e)
        for j in got[2]:  # final rows that open the next shard: through the writer
            try:
                self.add_one(j, obs[j], action[j], reward[j], next_obs[j], terminated[j],
                             truncated[j], {})
            except WriteFailedError as e:
                errors.append(e)
        idx.last_lane = plan.last_lane
        if errors:
            raise errors[0]
        return True

    def _moved(self, lane: int, table: LaneRows, enter: bool) -> None:
        """Open the lane's next shard (``enter``) or hand its full one to the background
        writer, then bring the table and the index up to date (as ``Appender._row`` does), in
        one C call (``plan.load``: no numpy call here, this runs inside an add)."""
        w = self.writers[lane]
        try:
            if enter:
                w._enter_shard()
            else:
                w._hand_off()
        finally:
            self._plan.load(lane)
            table.stale.discard(lane)
