"""Ray actors that each own one lane of a store, and a learner that samples across lanes.

:class:`LaneActor` is a plain class; wrap it with ``ray.remote(...)`` (``ray`` is imported
only there, by the caller). Each actor opens the store with ``es.open(url, "r+",
lane=lane)``: it holds that lane's lease and writes only that lane's objects, so actors on
different hosts need no coordination beyond the store. Rows are deterministic
(``testing.data``): every byte derives from (lane, step, writer session), so a learner or
a test can check whatever it reads. When Ray restarts a killed actor it runs
``__init__`` again: the new writer takes the dead one's lease over (same host: the owner
process is gone; another host: once the lease expires) and resumes at the lane's last
committed row; rows the dead actor had not flushed are gone, committed ones stay.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from .. import api as store_api
from ..sampling import PrioritizedSampler
from . import data


class LaneActor:
    """Writes lane ``lane`` of the store at ``url`` (``storage_options`` for object
    stores). ``session``: written into every row; a restarted actor takes a new one."""

    def __init__(self, url: str, lane: int, storage_options: dict | None = None,
                 lease_ttl: float = 30.0) -> None:
        self.url, self.lane = url, lane
        self.store = store_api.open(url, "r+", lane=lane, storage_options=storage_options,
                                    lease_ttl=lease_ttl)
        writer = self.store.writers[lane]
        self.start = writer.count  # where this writer (re)started: a new episode begins
        self.session = (os.getpid() % 30000) * 4 + lane % 4 + 1

    def info(self) -> dict[str, int]:
        """``pid``, ``start`` (the lane's row count when this actor opened it),
        ``committed`` (rows flushed so far) and ``count`` (rows written)."""
        w = self.store.writers[self.lane]
        return {"pid": os.getpid(), "start": self.start, "session": self.session,
                "committed": w.committed.count, "count": w.count}

    def write(self, steps: int, per: int = 25, flush_every: int = 2,
              pause: float = 0.0) -> dict[str, int]:
        """Append ``steps`` steps in batches of ``per``, flushing every ``flush_every``
        batches and at the end; ``pause`` seconds between batches (an env's pace)."""
        w = self.store.writers[self.lane]
        done = k = 0
        while done < steps:
            n = min(per, steps - done)
            batch, _ = data.make_steps(self.lane, w.count, n, self.session)
            self.store.extend(batch, lane=self.lane)
            done += n
            k += 1
            if k % flush_every == 0:
                self.store.flush()
            if pause:
                time.sleep(pause)
        self.store.flush()
        return self.info()

    def close(self) -> dict[str, int]:
        info = self.info()
        self.store.close()
        return info


def learn(url: str, storage_options: dict | None, batches: int, batch_size: int = 32,
          seed: int = 0, check: bool = True) -> dict[str, Any]:
    """A learner: refresh (rows the actors committed), sample prioritized batches across
    all lanes, check every sample byte for byte (``check``) and feed priorities back.

    Returns ``samples`` checked, ``lanes`` seen and the per-lane counts it saw last.
    """
    from ..errors import NotEnoughData

    store = store_api.open(url, "r", storage_options=storage_options)
    sampler = PrioritizedSampler(store, alpha=0.6, beta=0.4, seed=seed, persist=False)
    samples, lanes = 0, set()
    try:
        for _ in range(batches):
            store.refresh()
            try:
                batch = sampler.sample(batch_size)
            except NotEnoughData:
                time.sleep(0.05)
                continue
            if check:
                samples += data.check_batch(batch, store.index)
            lanes.update(np.unique(batch["index"] // store.layout.lane_capacity).tolist())
            td = np.abs(batch["reward"]) + 0.1 * (batch["index"] % 7)
            sampler.update_priorities(batch["index"], td, step_id=batch["step_id"])
        counts = [int(c) for c in store.index.count]
    finally:
        sampler.close()
        store.close()
    return {"samples": samples, "lanes": sorted(lanes), "counts": counts}
