"""Kill a writer anywhere, reopen the store, and prove every committed row survived.

:func:`writer` appends deterministic rows (``testing.data``) to several lanes with ``add``,
``extend`` and ``flush`` and logs, to an append-only text file, a ``S`` line when it starts
(session number, lane counts) and a ``F`` line whenever a call returns having committed
more (explicit ``flush()`` or a full shard written by ``add``/``extend``).
:func:`kill_once` forks a writer, kills it with SIGKILL either at a random moment or frozen
at a named crash point (``storage.faults``), and :func:`check_store` reopens the store and
checks that (1) every lane committed at least what the log says was flushed, (2) every
intact row holds exactly the bytes its writer session wrote, (3) the episode bookkeeping is
consistent, (4) sampling works and returns only correct transitions, (5) the saved
priorities load and kept what was saved, and (6) ``verify_store`` finds no problem.

Run ``python -m expstore.testing.crash write URL LOG SESSION SEED`` for a writer in a fresh
interpreter (crash point from ``EXPSTORE_CRASH_POINT``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import api as store_api
from ..sampling import PrioritizedSampler
from ..storage import faults
from . import data

POINTS = faults.POINTS


def create_store(url: str, lanes: int = 3, shard_rows: int = 32, shards_per_lane: int = 4,
                 storage_options: dict | None = None, **extras: Any) -> Any:
    """A fresh store for the crash harness (small shards so every run crosses several)."""
    cap = lanes * shard_rows * shards_per_lane
    store = store_api.create(url, data.spec(**extras), capacity=cap, lanes=lanes,
                             shard_rows=shard_rows, overwrite=True,
                             storage_options=storage_options)
    store.close()
    return url


def _log(path: str, kind: str, session: int, counts: list[int]) -> None:
    line = f"{kind} {session} " + " ".join(str(c) for c in counts) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


PRIORITIES = "crash"  # name of the priorities the writer keeps (``_index/crash.bin``)


def priority(lane: int, steps: np.ndarray) -> np.ndarray:
    """The priority the writer gives row ``steps`` of ``lane`` (alpha=1, eps=0: |td|)."""
    return 1.5 + (np.asarray(steps, np.int64) * 7 + lane) % 13


def writer(url: str, log_path: str, session: int, seed: int, ops: int | None = None,
           ready: Any = None, priorities: bool = True, adds_only: bool = False,
           storage_options: dict | None = None) -> None:
    """Append random batches to every lane of the store until killed (or ``ops`` done).

    With ``priorities``, a :class:`PrioritizedSampler` rides along: after every explicit
    flush the writer sets the priority of each live row whose step is a multiple of 3 to
    :func:`priority`, flushes again (which saves them) and logs a ``P`` line.
    ``adds_only``: one-step ``add`` calls only, never ``extend`` or ``flush``: every commit
    is a full shard written by the background thread (so are the crash points reached),
    and the rows of the open shards stay staged (in shared memory) until the writer ends.
    """
    store = store_api.open(url, "r+", storage_options=storage_options)
    lanes = store.lanes
    prio = (PrioritizedSampler(store, alpha=1.0, eps=0.0, name=PRIORITIES)
            if priorities else None)
    _log(log_path, "S", session, [store.writers[i].count for i in range(lanes)])
    if ready is not None:
        ready()
    rng = np.random.default_rng(seed)
    logged = [store.writers[i].committed.count for i in range(lanes)]
    done = 0
    while ops is None or done < ops:
        done += 1
        u = rng.random()
        if adds_only:
            u = 0.4 + 0.5 * u  # add: one lane, or every lane
        if u < 0.4:  # extend one lane
            lane = int(rng.integers(lanes))
            batch, _ = data.make_steps(lane, store.writers[lane].count,
                                       int(rng.integers(1, 40)), session)
            store.extend(batch, lane=lane)
        elif u < 0.7:  # one step on one lane
            lane = int(rng.integers(lanes))
            b, _ = data.make_steps(lane, store.writers[lane].count, 1, session)
            one = _index(b, 0)
            store.add(one["obs"], one["action"], one["reward"], one["next_obs"],
                      one["terminated"], one["truncated"], lane=lane, session=one["session"])
        elif u < 0.9:  # one step on every lane (leading num_envs axis)
            parts = [_index(data.make_steps(i, store.writers[i].count, 1, session)[0], 0)
                     for i in range(lanes)]
            b = _stack(parts)
            store.add(b["obs"], b["action"], b["reward"], b["next_obs"], b["terminated"],
                      b["truncated"], session=b["session"])
        else:
            store.flush()
            if prio is not None:
                for lane in range(lanes):
                    rows, steps = prio.priorities.live_rows(lane)
                    third = steps % 3 == 0
                    prio.update_priorities(rows[third], priority(lane, steps[third]),
                                           steps[third])
                store.flush()  # saves the priorities (after the data they describe)
                _log(log_path, "P", session, [store.writers[i].committed.count
                                              for i in range(lanes)])
        committed = [store.writers[i].committed.count for i in range(lanes)]
        if committed != logged:  # explicit and automatic (full shard) flushes alike
            _log(log_path, "F", session, committed)
            logged = committed
    store.close()
    _log(log_path, "F", session, [store.writers[i].committed.count for i in range(lanes)])


def _index(tree: Any, i: int) -> Any:
    if isinstance(tree, dict):
        return {k: _index(v, i) for k, v in tree.items()}
    return np.asarray(tree)[i]


def _stack(parts: list[Any]) -> Any:
    if isinstance(parts[0], dict):
        return {k: _stack([p[k] for p in parts]) for k in parts[0]}
    return np.stack(parts)


# -- the log -----------------------------------------------------------------------------
@dataclass
class Log:
    """What the writers said: session start counts and flushed counts, per lane."""

    starts: list[tuple[int, list[int]]] = field(default_factory=list)  # (session, counts)
    flushed: list[int] = field(default_factory=list)  # max committed count seen, per lane
    prio_saved: list[int] = field(default_factory=list)  # counts covered by saved priorities

    @classmethod
    def read(cls, path: str, lanes: int) -> Log:
        log = cls(flushed=[0] * lanes, prio_saved=[0] * lanes)
        if not os.path.exists(path):
            return log
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 2 + lanes:  # a torn last line cannot happen (one write)
                    raise AssertionError(f"{path}: malformed log line {line!r}")
                kind, session, counts = parts[0], int(parts[1]), [int(c) for c in parts[2:]]
                if kind == "S":
                    log.starts.append((session, counts))
                    continue
                if kind == "P":
                    log.prio_saved = [max(a, b) for a, b in zip(log.prio_saved, counts)]
                log.flushed = [max(a, b) for a, b in zip(log.flushed, counts)]
        return log

    def session_of(self, lane: int, steps: np.ndarray) -> np.ndarray:
        """The session that wrote each step (the newest session started at or before it)."""
        starts = np.array([c[lane] for _, c in self.starts], np.int64)
        sessions = np.array([s for s, _ in self.starts], np.int64)
        pos = np.searchsorted(starts, steps, side="right") - 1
        if (pos < 0).any():
            raise AssertionError(f"lane {lane}: steps before the first logged session")
        return sessions[pos]

    def start_counts(self, lane: int) -> set[int]:
        return {c[lane] for _, c in self.starts}


# -- killing -------------------------------------------------------------------------------
@dataclass
class Kill:
    """One writer run and how it ended."""

    session: int
    point: str | None  # crash point it was frozen at, None = a random moment
    reached: bool  # the crash point was reached (else it was killed at the time limit)
    seconds: float
    background: bool = False  # frozen in the background thread writing full shards


def kill_once(url: str, log_path: str, session: int, rng: np.random.Generator,
              point: str | None = None, nth: int = 1, delay: float = 0.2,
              timeout: float = 20.0, adds_only: bool = False,
              storage_options: dict | None = None) -> Kill:
    """Fork a writer and SIGKILL it: frozen at ``point`` (``nth`` hit), else after ``delay`` s.

    A frozen point not reached within ``timeout`` seconds is killed anyway (``reached`` is
    ``False`` then). ``storage_options``: for object stores (``s3://``).
    """
    ctx = mp.get_context("fork")
    r, w = os.pipe()
    proc = ctx.Process(target=_child, args=(url, log_path, session, int(rng.integers(2**31)),
                                            point, nth, w, adds_only, storage_options),
                       daemon=True)
    t0 = time.monotonic()
    proc.start()
    os.close(w)
    reached = background = False
    try:
        msg = _read_line(r, timeout)  # "ready" once the session is logged
        if msg != "ready":
            raise RuntimeError(f"crash writer did not start: {msg!r} (exit {proc.exitcode})")
        if point is None:
            time.sleep(delay)
        else:
            line = _read_line(r, timeout)
            reached = line.split(" (")[0] == "crash " + point
            background = line.endswith("(background)")
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        os.close(r)
    if proc.exitcode not in (-signal.SIGKILL, 0):
        raise RuntimeError(f"crash writer failed with exit code {proc.exitcode}")
    return Kill(session, point, reached, time.monotonic() - t0, background)


def _child(url: str, log_path: str, session: int, seed: int, point: str | None, nth: int,
           fd: int, adds_only: bool = False, storage_options: dict | None = None) -> None:
    def say(msg: str) -> None:
        os.write(fd, (msg + "\n").encode())

    def frozen(name: str) -> None:
        where = threading.current_thread().name
        say(f"crash {name}" + (" (background)" if where == "expstore-writer" else ""))

    def ready() -> None:  # armed once the store is open: the points are in the write path
        faults.arm(point, nth, notify=frozen)
        say("ready")

    try:
        writer(url, log_path, session, seed, ready=ready, adds_only=adds_only,
               storage_options=storage_options)
    except BaseException as e:  # report instead of dying silently
        say(f"error {type(e).__name__}: {e}")
        raise


@dataclass
class StagedKill:
    """A writer killed with rows staged: what it had committed and added, per lane, and
    its shared-memory staging files (path -> inode) as it left them."""

    committed: list[int]
    counts: list[int]
    files: dict[str, int]


def kill_staged(url: str, log_path: str, session: int, seed: int, steps: int = 100,
                timeout: float = 20.0) -> StagedKill:
    """Fork a writer that adds ``steps`` one-step rows per lane, flushes, adds up to a
    shard's worth more without flushing (rows staged in shared memory), says so, and is
    SIGKILLed. The store must reopen at that flush (``check_store``)."""
    ctx = mp.get_context("fork")
    r, w = os.pipe()
    proc = ctx.Process(target=_staged_child, args=(url, log_path, session, seed, steps, w),
                       daemon=True)
    proc.start()
    os.close(w)
    try:
        msg = _read_line(r, timeout)
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        os.close(r)
    if not msg.startswith("staged "):
        raise RuntimeError(f"staged writer did not get there: {msg!r}")
    import json

    got = json.loads(msg[len("staged "):])
    return StagedKill(got["committed"], got["counts"], got["files"])


def _staged_child(url: str, log_path: str, session: int, seed: int, steps: int,
                  fd: int) -> None:
    import json

    from ..storage.write import staging_path

    try:
        store = store_api.open(url, "r+")
        lanes = store.lanes
        _log(log_path, "S", session, [store.writers[i].count for i in range(lanes)])
        rng = np.random.default_rng(seed)

        def add(lane: int) -> None:
            b, _ = data.make_steps(lane, store.writers[lane].count, 1, session)
            one = _index(b, 0)
            store.add(one["obs"], one["action"], one["reward"], one["next_obs"],
                      one["terminated"], one["truncated"], lane=lane, session=one["session"])

        for _ in range(steps):
            for lane in range(lanes):
                add(lane)
        store.flush()
        _log(log_path, "F", session, [store.writers[i].committed.count for i in range(lanes)])
        S = store.layout.shard_rows
        for lane in range(lanes):  # staged, never flushed: not in the log's F lines
            for _ in range(int(rng.integers(1, S))):
                add(lane)
            while store.writers[lane].count % S == 0:  # (a full shard is not staged)
                add(lane)
        for lane in range(lanes):  # full shards among them are committed (background)
            store.writers[lane].wait()
        store._poll_writes()
        files = {}
        for lane in range(lanes):
            path = staging_path(store.backend.root, lane)
            if os.path.exists(path):
                files[path] = os.stat(path).st_ino
        got = {"committed": [store.writers[i].committed.count for i in range(lanes)],
               "counts": [store.writers[i].count for i in range(lanes)], "files": files}
        os.write(fd, ("staged " + json.dumps(got) + "\n").encode())
        while True:
            time.sleep(3600)
    except BaseException as e:
        os.write(fd, f"error {type(e).__name__}: {e}\n".encode())
        raise


def _read_line(fd: int, timeout: float) -> str:
    import select

    buf = b""
    end = time.monotonic() + timeout
    ready = select.poll()  # not select(): it fails for descriptors >= 1024
    ready.register(fd, select.POLLIN)
    while not buf.endswith(b"\n"):
        left = end - time.monotonic()
        if left <= 0 or not ready.poll(left * 1000):
            return buf.decode() or "timeout"
        chunk = os.read(fd, 1)
        if not chunk:
            return buf.decode() or "eof"
        buf += chunk
    return buf.decode().strip()


# -- checking ------------------------------------------------------------------------------
@dataclass
class CheckResult:
    rows: int  # committed rows checked byte for byte
    samples: int  # sampled transitions checked
    counts: list[int]  # committed count per lane
    priorities: int = 0  # rows whose saved priority was checked exactly


def check_store(url: str, log_path: str, sample: int = 64, verify: bool = True,
                storage_options: dict | None = None) -> CheckResult:
    """Reopen read-only and check everything the writers' log promises (AssertionError);
    ``verify``: ``expstore verify`` must find nothing wrong either."""
    store = store_api.open(url, "r", storage_options=storage_options)
    try:
        log = Log.read(log_path, store.lanes)
        counts = [int(c) for c in store.index.count]
        for lane in range(store.lanes):
            if counts[lane] < log.flushed[lane]:
                raise AssertionError(f"lane {lane}: {log.flushed[lane]} rows were flushed but "
                                     f"only {counts[lane]} are committed: data lost")
        rows = 0
        for lane in range(store.lanes):
            if not log.starts:
                break
            rows += data.check_lane(store, lane, log.session_of, log.start_counts(lane))
        samples = prio_rows = 0
        if sample:
            samples = _check_sampling(store, log, sample)
        if store.backend.get(f"_index/{PRIORITIES}.bin") is not None:
            prio_rows, n = _check_priorities(store, log, sample)
            samples += n
        if verify:
            from ..verify import verify_store

            rep = verify_store(url, storage_options)
            if not rep.ok:
                raise AssertionError(f"verify after a kill: {rep.problems}")
        return CheckResult(rows, samples, counts, prio_rows)
    finally:
        store.close()


def _check_sampling(store: Any, log: Log, n: int) -> int:
    from ..errors import NotEnoughData

    try:
        batch = store.sample(n)
    except NotEnoughData:
        return 0
    return data.check_batch(batch, store.index, log.session_of)


def _check_priorities(store: Any, log: Log, n: int) -> tuple[int, int]:
    """Saved priorities load; rows set before a logged save kept theirs; sampling works.

    Returns (rows whose priority was checked exactly, prioritized samples checked)."""
    from ..errors import NotEnoughData
    from ..rows import FLAG_FIRST, FLAG_LAST

    sampler = PrioritizedSampler(store, alpha=1.0, eps=0.0, name=PRIORITIES, seed=1)
    prio = sampler.priorities
    exact = 0
    for lane in range(store.lanes):
        rows, steps = prio.live_rows(lane)
        p = prio.get(rows)
        final = (store.index.flags[rows] & FLAG_LAST) != 0
        where = f"lane {lane} priorities"
        if (p[final] != 0).any():
            raise AssertionError(f"{where}: a final row carries a priority")
        allowed = np.isin(p, np.append(np.unique(priority(lane, np.arange(13))), 1.0))
        allowed |= (p == 0) & (steps + 1 >= int(store.index.count[lane]))  # waits for a next
        if not allowed[~final].all():
            bad = int(np.flatnonzero(~allowed & ~final)[0])
            raise AssertionError(f"{where}: step {int(steps[bad])} has priority {p[bad]}, "
                                 f"not one the writer ever gave")
        # (the newest row at a save was waiting for its next row: no priority to set yet;
        # a row whose episode a writer restart cut off never gets one)
        nxt = store.index.flags[store.index.lane_rows(lane, steps + 1)]
        cut = ((nxt & FLAG_FIRST) != 0) | (steps + 1 >= int(store.index.count[lane]))
        must = ~final & ~cut & (steps % 3 == 0) & (steps + 1 < log.prio_saved[lane])
        exact += int(must.sum())
        want = priority(lane, steps[must])
        if not np.array_equal(p[must], want):
            bad = int(np.flatnonzero(p[must] != want)[0])
            raise AssertionError(f"{where}: step {int(steps[must][bad])} was saved with "
                                 f"priority {want[bad]}, reopened with {p[must][bad]}")
    try:
        batch = sampler.sample(n)
    except NotEnoughData:
        return exact, 0
    finally:
        sampler.close()
    return exact, data.check_batch(batch, store.index, log.session_of)


def main(argv: list[str]) -> None:
    if len(argv) >= 5 and argv[0] == "write":
        url, log_path, session, seed = argv[1], argv[2], int(argv[3]), int(argv[4])
        writer(url, log_path, session, seed)
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
