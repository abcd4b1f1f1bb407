"""Env steps into a store's lanes: checked values -> rows (``rows.py``) -> each lane's
writer (storage) and the row index (RAM): which path a step takes, and the Python paths.

:meth:`Appender.add` and :meth:`Appender.extend` (``Store.add``/``extend``) choose the
path, after :class:`~expstore.write_access.WriteAccess` says the lanes may be written.
Three paths store the same rows. Where the C kernel was built and the spec is one it
stages, one step (one lane or one step in every lane) is staged by one C call
(:class:`~expstore.step_kernel_path.StepKernelPath`, ``step_kernel_path.py``); it hands
back to the Python paths here a step it does not take as is, and the final rows that open
a lane's next shard. In Python, one step is written field by field straight into the
lane's staging buffers (:meth:`Appender.add_one`: ``LaneWriter.slot``/``advance``, a
handful of Python operations per field, no arrays built); one step in every lane is
staged at once through ``LaneRows`` (:meth:`Appender.add_lanes`); many steps
(``Store.extend``) go through :func:`~expstore.rows.encode_steps` and
``LaneWriter.append`` (:meth:`Appender.add_many`).

**Never a wrong ``next_obs``.** The store keeps ``next_obs`` only where an episode ends; it is
otherwise the next row's ``obs``. So each lane holds the ``next_obs`` given with its newest
step. When the lane's next step starts from another observation (two envs interleaved in
one lane, transitions added out of order), the newest step is closed first: a final row
holds its ``next_obs`` (the step keeps the flags it was given, so unless terminated it
bootstraps from that row), and the new step starts a new episode. ``strict=True`` raises
instead. Within an ``extend`` batch that gives every ``next_obs``, a step whose
``next_obs`` differs from the next step's ``obs`` is closed the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .errors import ValidationError, WriteFailedError
from .rows import FLAG_FIRST, FLAG_LAST, FLAG_TERMINATED, FLAG_TRUNCATED
from .step_check import LanesCheck, StepCheck
from .step_kernel_path import StepKernelPath, encode_steps
from .storage.write import LaneRows
from .validate import (
    extend_batch,
    refuse_many_steps,
    step_from_mapping,
    validate_batch,
    validate_steps,
)
from .write_access import WriteAccess


class Appender:
    """The write path of one store: ``writers`` (lane -> LaneWriter), ``index`` (RowIndex),
    ``access`` (the checks before a write), ``poll_writes`` (applies the results of
    background shard writes, raising a failed one's error).

    ``open_step[lane]``: position in its episode of the lane's next row (0: a new episode).
    ``held_ok[lane]``: whether the lane holds the ``next_obs`` of its newest step (its
    episode is open), in ``held_vals[obs field][lane]`` (the field's dtype and shape: a
    frame stack's newest frame); ``False`` when unknown or the episode ended.
    """

    def __init__(self, spec: Any, writers: dict[int, Any], index: Any, access: WriteAccess,
                 poll_writes: Callable[[], None], strict: bool = False) -> None:
        self.spec = spec
        self.writers = writers
        self.index = index
        self.access = access
        self.poll_writes = poll_writes
        self.strict = strict
        #: the lane a store writing exactly one lane adds to by default (else None)
        self.one_lane = access.write_lanes[0] if len(access.write_lanes) == 1 else None
        self.check = StepCheck(spec)
        self.obs_names = list(spec.obs_names)
        self.single_obs = spec.structure.get("obs", {"kind": "single"})["kind"] == "single"
        self.names = list(spec.fields)
        self.single_action = "action" in spec.fields
        self.user_fields = [n for n in self.names if n not in spec.obs_names and
                            n not in spec.action_names and n not in ("reward", "terminated",
                                                                     "truncated")]
        self.open_step = np.zeros(index.lanes, np.int64)
        fields = spec.fields
        self.held_ok = np.zeros(index.lanes, bool)
        self.held_vals = {n: np.zeros((index.lanes, *fields[n].shape), fields[n].dtype)
                          for n in self.obs_names}
        self.lane_rows: LaneRows | None = None  # staging addresses per lane (first use)
        self.lanes_check = LanesCheck(spec, index.lanes)  # a vector step's common case
        self.step_kernel = StepKernelPath(spec, writers, index, self._table, self.open_step,
                                          self.held_ok, self.held_vals[self.obs_names[0]],
                                          self.add_one)

    # -- which path ---------------------------------------------------------------------------
    def add(self, obs: Any = None, action: Any = None, reward: Any = None,
            next_obs: Any = None, terminated: Any = None, truncated: Any = None,
            lane: int | None = None, **extras: Any) -> None:
        """``Store.add`` (an open store's ``add`` is this method: same signature): one step
        of ``lane`` (``None``: the one writable lane, else one step in every lane), by one
        C call where it can (``step_kernel.add``), else :meth:`add_lanes` or
        :meth:`add_one`."""
        self.poll_writes()  # background shard writes: commits, or an error raised here
        access, writers, lanes = self.access, self.writers, self.index.lanes
        write_lanes = access.write_lanes
        if not extras and not access.closed and writers:  # one C call, where it can
            at = lane
            if at is None and self.one_lane is not None:  # a one-lane writer's add:
                at = self.one_lane  # ``access.writer(at)``'s checks, inlined (all hold)
                lease = access.leases.get(at)
                if lease is not None:
                    lease.ensure()  # renews the lane's lease when due
            else:
                if at is None:
                    at = -1 if lanes > 1 and len(writers) == lanes else None
                if at == -1 and lane is None:
                    access.ensure_leases()
                elif at is not None and at in writers:
                    access.writer(at)  # renews the lane's lease when due
                else:
                    at = None
            if at is not None and self.step_kernel.add(at, obs, action, reward, next_obs,
                                                       terminated, truncated):
                return
        if action is None and reward is None:  # one mapping (or no step at all)
            obs, action, reward, next_obs, terminated, truncated, extras = step_from_mapping(
                obs, next_obs, terminated, truncated, extras)
        if lane is None and len(write_lanes) == 1:
            lane = write_lanes[0]
        if type(reward) is np.ndarray and reward.ndim and lane is not None:
            refuse_many_steps(self.spec, reward, lane, lanes, len(write_lanes))
        if lane is None and lanes > 1:
            if access.closed or len(writers) != lanes:
                for i in range(lanes):
                    access.writer(i)  # raises, naming what is not writable
            access.ensure_leases()
            batch = self.lanes_check.check(obs, action, reward, next_obs, terminated,
                                           truncated, extras)
            if batch is None:  # anything else: cast, checked, or refused naming the field
                batch = validate_steps(self.spec, obs, action, reward, next_obs, terminated,
                                       truncated, extras, (lanes,))
            self.add_lanes(batch)
            return
        lane = 0 if lane is None else lane
        access.writer(lane)
        self.add_one(lane, obs, action, reward, next_obs, terminated, truncated, extras)

    def extend(self, batch: Mapping[str, Any] | None, lane: int | None, check_next_obs: bool,
               fields: dict[str, Any]) -> None:
        """``Store.extend``: ``T`` consecutive steps of ``lane`` (``None``: the one
        writable lane, else 0), given as one mapping or as keywords (``fields``)."""
        batch = extend_batch(batch, fields)
        if lane is None:
            write_lanes = self.access.write_lanes
            lane = write_lanes[0] if len(write_lanes) == 1 else 0
        self.access.writer(lane)
        self.poll_writes()  # background shard writes: commits, or an error raised here
        self.add_many(lane, validate_batch(self.spec, batch), check_next_obs)

    def extend_checked(self, lane: int, vals: dict[str, np.ndarray],
                       check_next_obs: bool) -> None:
        """``Store.extend_checked``: :meth:`add_many` of steps already checked and cast,
        full shards written in the background (as :meth:`add` leaves them)."""
        self.access.writer(lane)
        self.poll_writes()  # background shard writes: commits, or an error raised here
        self.add_many(lane, vals, check_next_obs, wait=False)

    def _table(self) -> LaneRows:
        """The lanes' staging table (made at first use), shared with the C path."""
        if self.lane_rows is None:
            self.lane_rows = LaneRows([self.writers.get(j) for j in range(self.index.lanes)])
        return self.lane_rows

    # -- one step of one lane ------------------------------------------------------------------
    def add_one(self, lane: int, obs: Any, action: Any, reward: Any, next_obs: Any,
                terminated: Any, truncated: Any, extras: dict[str, Any]) -> None:
        """Check one step of ``lane`` and stage its row (and its final row if it ends an
        episode); nothing is stored when a value is refused."""
        checks = self.check.checks
        if self.single_obs:
            vals = {"obs": checks["obs"](obs)}
        else:
            vals = {n: checks[n](v) for n, v in self.spec.flatten("obs", obs).items()}
        if self.single_action:
            vals["action"] = checks["action"](action)
        else:
            vals.update((n, checks[n](v))
                        for n, v in self.spec.flatten("action", action).items())
        vals["reward"] = checks["reward"](reward)
        term = bool(checks["terminated"](terminated))
        trunc = bool(checks["truncated"](truncated))
        vals["terminated"], vals["truncated"] = term, trunc
        if extras or self.user_fields:
            known = self._extras(extras)
            for name in self.user_fields:
                vals[name] = checks[name](known.get(name))
        done = term or trunc
        final_obs = finals = None
        if done:
            if next_obs is None:
                raise ValidationError("next_obs: required for steps that end an episode "
                                      "(terminated or truncated)")
            final_obs = self._next_obs(next_obs)
            finals = {k[5:]: checks[k[5:]](v) for k, v in extras.items()
                      if k.startswith("next_") and k[5:] in self.user_fields}
        closes = self.held_ok[lane] and not self._continues(lane, vals)
        if closes:
            self._refuse_if_strict(lane, "this step's obs")
            held = self._checked_held(lane)
        new_held = None if done or next_obs is None else self._hold(next_obs)
        self._retry_failed(lane)
        error = self._close(lane, held) if closes else None
        error = self._stage(lane, vals, term, trunc, final_obs, finals or {}) or error
        self._set_held(lane, new_held)
        if error is not None:
            raise error

    def _extras(self, extras: dict[str, Any]) -> dict[str, Any]:
        fields = self.spec.fields
        unknown = [k for k in extras if k not in fields and not (
            k.startswith("next_") and k[5:] in self.user_fields)]
        if unknown:
            raise ValidationError(f"unknown field(s) {unknown}; the spec has {list(fields)}")
        return extras

    def _next_obs(self, next_obs: Any) -> dict[str, Any]:
        given = ({"obs": next_obs} if self.single_obs
                 else self.spec.flatten("obs", next_obs))
        check = self.check.next
        return {name: check[name](given[name]) for name in self.obs_names}

    def _hold(self, next_obs: Any) -> dict[str, np.ndarray]:
        """``next_obs`` to compare the lane's next step with (checked only if it is ever
        stored: see :meth:`_checked_held`), to copy with :meth:`_set_held`; a frame stack
        keeps its newest frame."""
        given = ({"obs": next_obs} if self.single_obs
                 else self.spec.flatten("obs", next_obs))
        out = {}
        for name in self.obs_names:
            v, f = given[name], self.spec.fields[name]
            if f.stack and type(v) is np.ndarray and v.shape == (f.stack, *f.shape):
                v = v[-1]
            if type(v) is not np.ndarray or v.dtype != f.dtype or v.shape != f.shape:
                v = self.check.next[name](v)  # as the step's obs will be: cast, checked
            out[name] = v
        return out

    def _set_held(self, lane: int, held: dict[str, Any] | None) -> None:
        """The lane's held ``next_obs`` becomes a copy of ``held`` (``None``: none)."""
        if held is None:
            self.held_ok[lane] = False
            return
        for name, v in held.items():
            self.held_vals[name][lane] = v
        self.held_ok[lane] = True

    def _checked_held(self, lane: int) -> dict[str, Any]:
        """The held ``next_obs`` of the lane, checked before it is stored in a final row
        (a refused value drops it: the newest step stays without a final row)."""
        try:
            return {name: self.check.next[name](held[lane])
                    for name, held in self.held_vals.items()}
        except ValidationError as e:
            self.held_ok[lane] = False
            raise ValidationError(f"lane {lane}'s newest step: {e} (its next_obs is stored "
                                  "now, as this step does not continue it)") from None

    def _continues(self, lane: int, vals: dict[str, Any]) -> bool:
        """Whether the step's observation is exactly (byte for byte) the lane's held one."""
        for name, held in self.held_vals.items():
            h, v = held[lane], vals[name]
            if not (type(v) is np.ndarray and v.shape == h.shape and v.dtype == h.dtype):
                v = np.asarray(v, h.dtype) if np.shape(v) == h.shape else None
            if v is None or v.tobytes() != h.tobytes():
                return False
        return True

    def _stage(self, lane: int, vals: dict[str, Any], term: bool, trunc: bool,
               final_obs: dict[str, Any] | None, finals: dict[str, Any]) -> Any:
        """Stage the step's row (+ its final row); returns a shard write error to raise
        once the index knows the rows (they are staged either way)."""
        ep = int(self.open_step[lane])
        flag = (FLAG_FIRST if ep == 0 else 0) | (FLAG_TERMINATED if term else 0) | (
            FLAG_TRUNCATED if trunc else 0)
        error = self._row(lane, vals, ep, flag)
        self.open_step[lane] = ep + 1
        if final_obs is None:
            return error
        return self._final_row(lane, {**final_obs, **finals}) or error

    def _final_row(self, lane: int, values: dict[str, Any]) -> Any:
        """The final row ending the lane's open episode: ``values`` (the final observation,
        user fields' ``next_<field>``), zeros elsewhere. Returns a shard write error."""
        row: dict[str, Any] = {name: 0 for name in self.names}
        row.update(values)
        error = self._row(lane, row, int(self.open_step[lane]), FLAG_LAST)
        self.open_step[lane] = 0
        self.writers[lane].episodes += 1
        return error

    def _refuse_if_strict(self, lane: int, what: str) -> None:
        if self.strict:
            raise ValidationError(
                f"obs: lane {lane}'s newest step gave a next_obs that {what} does not "
                "continue (strict=True); write interleaved envs to separate lanes, or open "
                "the store with strict=False to close the step first")

    def _row(self, lane: int, vals: dict[str, Any], ep: int, flag: int) -> Any:
        """Stage one row (shards whose write failed were retried by the caller first:
        :meth:`_retry_failed`); a shard write error, after staging, is returned."""
        w = self.writers[lane]
        bufs, i = w.slot(retry=False)
        for name, v in vals.items():
            bufs[name][i] = v
        step = w.count
        bufs["_step_id"][i] = step
        bufs["_episode_step"][i] = ep
        bufs["_flags"][i] = flag
        error = None
        try:
            w.advance()
        except WriteFailedError as e:  # staged; only the shard write failed
            error = e
        idx = self.index
        if w.valid_from > idx.valid_from[lane]:
            idx.set_valid_from(lane, w.valid_from)
        idx.put_row(lane, step, ep, flag)
        idx.committed[lane] = w.committed.count
        if self.lane_rows is not None:
            self.lane_rows.stale.add(lane)
        return error

    def _retry_failed(self, lane: int) -> None:
        """Write shards whose write failed before staging more: raises (nothing staged,
        nothing changed) while the storage still refuses."""
        w = self.writers[lane]
        if w.pending:
            w.flush()

    def _close(self, lane: int, held: dict[str, Any]) -> Any:
        """End the lane's open episode after its newest step: a final row holding the
        (checked) ``next_obs`` given with that step, whose flags stay as given. Returns a
        shard write error (the row is staged either way)."""
        error = self._final_row(lane, held)
        self.held_ok[lane] = False
        return error

    # -- one step in every lane ---------------------------------------------------------------
    def add_lanes(self, vals: dict[str, np.ndarray]) -> None:
        """One checked step per lane (``validate_steps`` output with leading axis
        ``lanes``; ``next_<obs field>`` present when ``next_obs`` was given), every lane's
        row staged at once (:class:`~expstore.storage.write.lane_rows.LaneRows`): the same rows
        as :meth:`add_one` for each lane in turn."""
        lanes = len(vals["reward"])
        nxt = ({n: vals["next_" + n] for n in self.obs_names}
               if "next_" + self.obs_names[0] in vals else None)
        closes = self._broken(vals, lanes)
        if len(closes):
            self._refuse_if_strict(int(closes[0]), "this step's obs")
        lr = self._table()
        for w in lr.writers:  # raising here leaves every lane untouched
            if w.pending:
                w.flush()
        held = {lane: self._checked_held(lane) for lane in closes.tolist()}
        errors = [e for e in (self._close(lane, held[lane]) for lane in held) if e is not None]
        term, trunc = vals["terminated"], vals["truncated"]
        ep = self.open_step.copy()
        flags = (ep == 0).view(np.uint8) * FLAG_FIRST
        flags |= term.view(np.uint8) * FLAG_TERMINATED
        flags |= trunc.view(np.uint8) * FLAG_TRUNCATED
        rows = {name: vals[name] for name in self.names}
        rows["_episode_step"], rows["_flags"] = ep, flags
        self._put_lanes(lr, rows, ep, flags, None)
        self.open_step += 1
        done = term | trunc
        if done.any():  # final rows of the lanes whose episode ended
            d = np.flatnonzero(done)
            finals: dict[str, Any] = {}
            for name in self.names:
                if name in self.obs_names:
                    finals[name] = nxt[name][d]
                elif "next_" + name in vals and name in self.user_fields:
                    finals[name] = vals["next_" + name][d]
                else:
                    f = self.spec.fields[name]
                    finals[name] = np.zeros((len(d), *f.shape), f.dtype)
            ep_f = self.open_step[d]
            flags_f = np.full(len(d), FLAG_LAST, np.uint8)
            finals["_episode_step"], finals["_flags"] = ep_f, flags_f
            self._put_lanes(lr, finals, ep_f, flags_f, d)
            self.open_step[d] = 0
            for lane in d.tolist():
                self.writers[lane].episodes += 1
        if nxt is None:
            self.held_ok[:lanes] = False
        else:
            for n, v in nxt.items():
                self.held_vals[n][:lanes] = v
            self.held_ok[:lanes] = ~done
        if errors:
            raise errors[0]

    def _broken(self, vals: dict[str, np.ndarray], lanes: int) -> np.ndarray:
        """Lanes whose held ``next_obs`` this step's ``obs`` does not continue (byte for
        byte)."""
        ok = self.held_ok[:lanes]
        if not ok.any():
            return np.zeros(0, np.int64)
        differ = np.zeros(lanes, bool)
        for n in self.obs_names:
            a = np.ascontiguousarray(vals[n]).view(np.uint8).reshape(lanes, -1)
            h = self.held_vals[n][:lanes].view(np.uint8).reshape(lanes, -1)
            differ |= (a != h).any(axis=1)
        return np.flatnonzero(ok & differ)

    def _put_lanes(self, lr: LaneRows, rows: dict[str, np.ndarray], ep: np.ndarray,
                   flags: np.ndarray, lanes: np.ndarray | None) -> None:
        """Stage one row per lane (of ``lanes``; all when ``None``) and index it (a
        background write's error surfaces at the store's next call, as for one step)."""
        steps, changed = lr.put(rows, lanes)
        idx = self.index
        for lane in changed:
            w = self.writers[lane]
            if w.valid_from > idx.valid_from[lane]:
                idx.set_valid_from(lane, w.valid_from)
            idx.committed[lane] = w.committed.count
        idx.put_lanes(lanes, steps, ep, flags)

    # -- many steps --------------------------------------------------------------------------
    def add_many(self, lane: int, vals: dict[str, np.ndarray], check_next_obs: bool = True,
                 wait: bool = True) -> None:
        """Stage ``T`` checked consecutive steps of ``lane`` (``validate_steps`` output);
        ``check_next_obs=False``: ``next_obs`` is read only where an episode ends;
        ``wait``: return once the shards these steps filled are written."""
        T = len(vals["reward"])
        if T == 0:
            return
        nxt = {n: vals["next_" + n] for n in self.obs_names if "next_" + n in vals}
        closes = self.held_ok[lane] and not self._continues(
            lane, {n: vals[n][0] for n in self.obs_names})
        if closes:
            self._refuse_if_strict(lane, "the batch's first obs")
        complete = check_next_obs and len(nxt) == len(self.obs_names)
        if complete and T > 1:  # a step whose next_obs is not the next step's obs ends there
            broken = np.zeros(T, bool)
            for n in self.obs_names:
                a, b = vals[n][1:], nxt[n][:-1]
                broken[:-1] |= ~(a == b).reshape(T - 1, -1).all(axis=1)
            broken &= ~(vals["terminated"] | vals["truncated"])
            if broken.any() and self.strict:
                raise ValidationError(f"obs: step {int(np.argmax(broken)) + 1} of the batch "
                                      "does not continue the step before it (its next_obs "
                                      "differs; strict=True)")
            ends = (vals["terminated"] | vals["truncated"] | broken) if broken.any() else None
        else:
            ends = None
        held = self._checked_held(lane) if closes else None
        self._retry_failed(lane)  # raises before anything is staged
        error = self._close(lane, held) if closes else None
        error = self._append_rows(lane, vals, ends, wait) or error
        done = bool(vals["terminated"][-1] | vals["truncated"][-1])
        self._set_held(lane, None if done or not complete else {
            n: v[-1] for n, v in nxt.items()})
        if error is not None:
            raise error

    def _append_rows(self, lane: int, vals: dict[str, np.ndarray],
                     ends: np.ndarray | None = None, wait: bool = True
                     ) -> WriteFailedError | None:
        """Stage the rows of ``vals`` (a final row after each step of ``ends``, default:
        those that end an episode); a shard write error after staging is returned
        (``wait=False``: full shards are left to the background writer)."""
        w = self.writers[lane]
        rows, next_open, n_final = encode_steps(vals, self.names, int(self.open_step[lane]),
                                                w.count, ends)
        start = w.count
        error: WriteFailedError | None = None
        try:
            w.append(rows, retry=False, wait=wait)
        except WriteFailedError as e:  # all rows staged, a shard write failed
            error = e
        w.episodes += n_final
        self.open_step[lane] = next_open
        self.index.set_valid_from(lane, w.valid_from)
        self.index.put(lane, start, rows["_episode_step"], rows["_flags"], committed=False)
        self.index.committed[lane] = w.committed.count
        if self.lane_rows is not None:
            self.lane_rows.stale.add(lane)
        return error
