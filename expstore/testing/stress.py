"""Ape-X under load: writer processes wrap small rings at full speed while a learner
refreshes, samples prioritized batches through DataLoader workers and updates priorities.

:func:`run` makes a store of ``writers`` lanes, starts one writer process per lane (``add``
at full speed, never a flush, so the rings wrap many times a second and readers see rows
through shared staging and through the shards each full one is written to) and a learner
process: ``PrioritizedSampler(refresh_every=...)`` through ``make_loader(num_workers=2)``,
``update_priorities`` after every batch, every sample checked against what its writer
wrote at that step (:func:`check_batch`). Any exception in the learner is a failure; a
learner that does not finish within its time budget is killed and counted as a hang.

Row contents encode where they belong: the row of lane step ``s`` of lane ``lane`` holds
``obs = (lane, s // 4096, s % 4096, 1)``, ``action = s % 2`` and ``reward = s % 1000``.
Each add writes row ``s``; an episode's end also writes its final row ``s + 1``, so a
transition's ``next_obs`` is always the row of step ``s + 1``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .. import api as store_api
from ..field import Field
from ..spec import Spec

EPISODE = 200  # steps per episode


def spec() -> Spec:
    return Spec.create(obs=Field((4,), np.float32),
                       action=Field((), np.int64, low=0, high=1))


def encode(lane: int, step: int) -> np.ndarray:
    return np.array([lane, step // 4096, step % 4096, 1], np.float32)


def writer(url: str, lane: int, seconds: float) -> None:
    """Add CartPole-shaped rows to ``lane`` as fast as possible for ``seconds``."""
    store = store_api.open(url, mode="r+", lane=lane)
    try:
        s = int(store.index.count[lane])
        obs, nxt = encode(lane, s), encode(lane, s + 1)
        t, t0 = 0, time.monotonic()
        while t & 1023 or time.monotonic() - t0 < seconds:  # (the clock: every 1024 adds)
            done = t % EPISODE == EPISODE - 1
            store.add(obs, s % 2, float(s % 1000), nxt, done, False)
            s += 2 if done else 1
            obs[1:3] = divmod(s, 4096)
            nxt[1:3] = divmod(s + 1, 4096)
            t += 1
    finally:
        store.close()


def check_batch(batch: dict[str, np.ndarray], lane_capacity: int) -> int:
    """Assert every sample holds what its writer wrote at its step; returns samples."""
    steps = np.asarray(batch["step_id"], np.int64)
    lanes = np.asarray(batch["index"], np.int64) // lane_capacity
    want = np.stack([lanes, steps // 4096, steps % 4096, np.ones_like(steps)], 1)
    obs, nxt = np.asarray(batch["obs"]), np.asarray(batch["next_obs"])
    bad = np.flatnonzero((obs != want).any(1) | (nxt[:, 1] * 4096 + nxt[:, 2] != steps + 1)
                         | (nxt[:, 0] != lanes)
                         | (np.asarray(batch["action"]) != steps % 2)
                         | (np.asarray(batch["reward"]) != steps % 1000))
    if len(bad):
        i = int(bad[0])
        raise AssertionError(f"sample {i} of lane {lanes[i]} step {steps[i]}: obs {obs[i]}, "
                             f"next_obs {nxt[i]}, action {batch['action'][i]}, reward "
                             f"{batch['reward'][i]} (expected obs {want[i]})")
    return len(steps)


@dataclass
class LearnerResult:
    batches: int = 0
    samples: int = 0  # checked value for value
    refreshes: int = 0
    lapped: int = 0  # lane states re-read because a refresh met a shard its writer lapped
    priority_updates: int = 0
    stale_replaced: int = 0
    seconds: float = 0.0
    error: str | None = None


def learner(url: str, seconds: float, refresh_every: float, batch_size: int = 64,
            workers: int = 2) -> LearnerResult:
    """Sample ``url`` through ``workers`` DataLoader workers for ``seconds``."""
    from .. import index_loader
    from ..loading import make_loader
    from ..sampling import PrioritizedSampler

    res = LearnerResult()
    read_state = index_loader.read_state

    def counted_read_state(*args: Any) -> Any:  # (the loader reads one only when lapped)
        res.lapped += 1
        return read_state(*args)

    index_loader.read_state = counted_read_state
    t0 = time.monotonic()
    store = None
    try:
        store = store_api.open(url)
        refresh = store.refresh

        def counted_refresh() -> None:
            res.refreshes += 1
            refresh()

        store.refresh = counted_refresh
        while len(store) < 4 * batch_size:
            store.refresh()
            time.sleep(0.01)
        sampler = PrioritizedSampler(store, refresh_every=refresh_every)
        loader = make_loader(store, sampler, batch_size=batch_size, num_workers=workers)
        try:
            for batch in loader:
                b = {k: v.numpy() for k, v in batch.items()}
                res.samples += check_batch(b, store.layout.lane_capacity)
                sampler.update_priorities(b["index"], np.abs(b["reward"]) + 0.01,
                                          step_id=b["step_id"])
                res.priority_updates += len(b["index"])
                res.batches += 1
                if time.monotonic() - t0 >= seconds:
                    break
            res.stale_replaced = int(loader.stats.stale_replaced)
        finally:
            loader.close()
    except Exception:
        res.error = traceback.format_exc()
    finally:
        if store is not None:
            store.close()
    res.seconds = time.monotonic() - t0
    return res


def _learner_child(queue: Any, *args: Any) -> None:
    queue.put(asdict(learner(*args)))


def _result(queue: Any, proc: Any, timeout: float) -> LearnerResult | None:
    """The learner's result; ``None`` if it gives none within ``timeout`` s or dies."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            return LearnerResult(**queue.get(timeout=0.2))
        except Exception:  # queue.Empty
            if not proc.is_alive() and queue.empty():
                return None
    return None


@dataclass
class StressResult:
    runs: int = 0
    writers: int = 0
    ring_rows: int = 0
    laps: float = 0.0  # times each ring was wrapped, summed over runs (mean over lanes)
    refreshes: int = 0
    lapped: int = 0
    batches: int = 0
    samples: int = 0
    priority_updates: int = 0
    hangs: int = 0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.runs} runs, {self.writers} writers, rings of {self.ring_rows} rows "
                f"wrapped {self.laps:.0f} times, {self.refreshes} refreshes (lane states re-read "
                f"{self.lapped} times after a lapped shard), {self.batches} "
                f"batches, {self.samples} samples checked, {self.priority_updates} priority "
                f"updates, {len(self.errors)} errors, {self.hangs} hangs")


def run(workdir: str, runs: int = 1, seconds: float = 4.0, writers: int = 2,
        ring_rows: int = 16384, refresh_every: float = 0.5, batch_size: int = 64,
        head_start: float = 1.0, grace: float = 30.0) -> StressResult:
    """``runs`` rounds of ``writers`` writer processes and one learner for ``seconds``
    each, on a fresh store in ``workdir`` every round; the learner opens the store
    ``head_start`` seconds after the writers start (their rings full and wrapping). A
    learner still running ``grace`` seconds after its time is up is killed and counted
    in ``hangs``."""
    ctx = mp.get_context("fork")
    out = StressResult(writers=writers, ring_rows=ring_rows)
    for k in range(runs):
        url = os.path.join(workdir, f"stress-{k}.zarr")
        store_api.create(url, spec(), capacity=writers * ring_rows, lanes=writers,
                         overwrite=True).close()
        procs = [ctx.Process(target=writer, args=(url, i, head_start + seconds + 1.0),
                             daemon=True) for i in range(writers)]
        for p in procs:
            p.start()
        time.sleep(head_start)
        queue = ctx.Queue()
        lp = ctx.Process(target=_learner_child,
                         args=(queue, url, seconds, refresh_every, batch_size))
        lp.start()
        got = _result(queue, lp, seconds + grace)
        if got is None:
            got = LearnerResult(error=f"the learner gave no result within "
                                      f"{seconds + grace:.0f} s (exit code {lp.exitcode})")
            out.hangs += lp.is_alive()
        lp.join(grace)
        if lp.is_alive():
            lp.kill()
            lp.join()
        for p in procs:
            p.join(grace)
            if p.is_alive():
                p.kill()
                out.errors.append(f"run {k}: a writer did not finish")
        with store_api.open(url) as st:
            out.laps += float(np.mean(st.index.count)) / ring_rows
        out.runs += 1
        out.refreshes += got.refreshes
        out.lapped += got.lapped
        out.batches += got.batches
        out.samples += got.samples
        out.priority_updates += got.priority_updates
        if got.error:
            out.errors.append(f"run {k}: {got.error}")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m expstore.testing.stress --runs 50``: the stress test, long; prints its
    summary and each error, exits 1 on any error or hang."""
    import argparse
    import tempfile

    p = argparse.ArgumentParser(prog="python -m expstore.testing.stress",
                                description=main.__doc__)
    p.add_argument("--runs", type=int, default=16)
    p.add_argument("--seconds", type=float, default=2.0, help="learner seconds per run")
    p.add_argument("--writers", type=int, default=3, help="writer processes (one lane each)")
    p.add_argument("--ring", type=int, default=16384, help="rows per lane")
    p.add_argument("--refresh-every", type=float, default=0.25, help="learner, seconds")
    p.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        t0 = time.monotonic()
        res = run(d, runs=a.runs, seconds=a.seconds, writers=a.writers, ring_rows=a.ring,
                  refresh_every=a.refresh_every)
    print(f"{res.summary()}; {time.monotonic() - t0:.0f} s")
    for e in res.errors:
        print(e)
    return 1 if res.errors or res.hangs else 0


if __name__ == "__main__":
    raise SystemExit(main())
