"""A learner thread sampling a store while an actor thread of the same process adds to it
at full speed, lapping a 256-row ring many times a second; every sampled transition is
checked against the one its obs names. ``tests/test_hot_set.py`` races it for seconds,
``scripts/thread_soak.py`` for minutes.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np

from .. import api as store_api
from ..field import Field
from ..sampling import UniformSampler
from ..spec import Spec

EP_LEN = 23  # steps per episode (one final row each)


def key(g: int) -> float:
    """Transition ``g``'s obs value: episode * 100 + position (next_obs: + 1)."""
    return float((g // EP_LEN) * 100 + g % EP_LEN)


def write(store: Any, start: int, n: int) -> None:
    """Transitions ``start .. start + n`` (obs ``key(g)``, action ``(k, -k)``, reward ``k``)."""
    for g in range(start, start + n):
        k = key(g)
        store.add(np.full(5, k, np.float32), np.array([k, -k], np.float32), float(k),
                  np.full(5, k + 1, np.float32), g % EP_LEN == EP_LEN - 1, False)


def wrong_samples(batch: dict) -> np.ndarray:
    """Indices of samples whose fields are not all of the transition their obs names."""
    k = batch["obs"][:, 0]
    ok = (batch["obs"] == k[:, None]).all(1) & (batch["next_obs"] == k[:, None] + 1).all(1)
    ok &= (batch["action"][:, 0] == k) & (batch["action"][:, 1] == -k)
    ok &= (batch["reward"] == k) & (k % 100 < EP_LEN)  # (not a final row's obs)
    ok &= batch["terminated"] == (k % 100 == EP_LEN - 1)
    return np.flatnonzero(~ok)


def race(path: str, seconds: float, seed: int = 0, chunk_rows: int | None = None,
         switch_after: float | None = None, switch: float = 1e-5
         ) -> tuple[int, int, list[dict]]:
    """A store at ``path`` (``chunk_rows`` per inner chunk of its vectors), raced for
    ``seconds``: ``(batches of 32 read, rows added, wrong samples as dicts)``. From
    ``switch_after`` seconds on, the interpreter hands the GIL between the threads every
    ``switch`` s (then set back). An actor thread's error is raised."""
    spec = Spec.create(obs=Field((5,), np.float32, chunk_rows=chunk_rows),
                       action=Field((2,), np.float32, chunk_rows=chunk_rows))
    store = store_api.create(path, spec, capacity=256, shard_rows=32, fsync=False)
    write(store, 0, 64)
    done = threading.Event()
    errors: list[BaseException] = []

    def adding() -> None:
        g = 64
        try:
            while not done.is_set():
                write(store, g, 5)
                g += 5
        except BaseException as e:  # raised below
            errors.append(e)

    sampler = UniformSampler(store, seed=seed)
    thread = threading.Thread(target=adding)
    thread.start()
    batches, wrong = 0, []
    interval = sys.getswitchinterval()
    try:
        start = time.monotonic()
        while (now := time.monotonic()) < start + seconds:
            if switch_after is not None and now >= start + switch_after:
                sys.setswitchinterval(switch)
            batch = sampler.sample(32)
            batches += 1
            for i in wrong_samples(batch):
                wrong.append({k: v[i].tolist() for k, v in batch.items()})
    finally:
        sys.setswitchinterval(interval)
        done.set()
        thread.join()
    if errors:
        raise errors[0]
    added = store.writers[0].count
    store.close()
    return batches, added, wrong
