"""Batches of an SB3 buffer that samples from its store (no RAM mirror).

The store learns a step's ``next_obs`` only from the step after it, so a
:class:`~expstore.integrations.step_writer.StepWriter` holds each env's newest step back.
Adds land in a small staging ring (a :class:`~.mirror.RamMirror`) that a writer thread
empties into the store. :func:`staged_pending` finds the staged transitions the store
cannot serve yet (not written, held, or written without all of their following rows) and
:func:`deal_staged` deals them into batches with the probability any stored transition
has, so a transition is sampleable as soon as it is added.
:class:`BatchPrefetcher` draws the next batch from the store on a background thread while
the learner works on the current one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

Batch = dict[str, np.ndarray]


def staged_pending(ram: Any, written: int, held: np.ndarray,
                   n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(add counts, envs) of the steps in the staging ring ``ram`` the store cannot serve
    yet: adds ``0..written-1`` were handed to the store, where each env's last one stays
    held (``held``) unless it ended its episode; a step is served once the store has the
    rows of its ``n_steps`` successors or of a done step within them."""
    lo = max(ram.adds - ram.size, 0)
    t = np.arange(max(lo, written - n_steps - 2), ram.adds)
    if not len(t):
        return t, t
    slots = t % ram.size
    done = (ram.arrays["terminated"][slots] | ram.arrays["truncated"][slots]) \
        & (t < written)[:, None]
    first = np.arange(len(t))
    stop = np.minimum(first + n_steps, len(t))
    out_t, out_e = [], []
    for e in range(ram.n_envs):
        ends = np.concatenate([[0], np.cumsum(done[:, e])])
        servable = (t + n_steps < written - int(held[e])) | (ends[stop] > ends[first])
        out_t.append(t[~servable])
        out_e.append(np.full(int((~servable).sum()), e))
    return np.concatenate(out_t), np.concatenate(out_e)


def deal_staged(batch: Batch | None, batch_size: int, ram: Any, adds: np.ndarray,
                envs: np.ndarray, stored: int, rng: np.random.Generator, n_steps: int,
                gamma: float) -> Batch:
    """Put the pending steps ``(adds, envs)`` of ``ram`` in place of entries of ``batch``
    (drawn from ``stored`` transitions), each entry with probability ``pending / (stored
    + pending)``; ``batch=None``: a batch of pending steps alone. Their ``index`` and
    ``step_id`` are -1 (no priority to update)."""
    P, B = len(adds), int(batch_size)
    if batch is not None and (not P or not stored):
        where = np.arange(0) if not P else np.arange(B)
    elif batch is not None:
        where = np.flatnonzero(rng.random(B) < P / (stored + P))
    else:
        where = np.arange(B)
    if not len(where):
        return batch  # type: ignore[return-value]
    pick = rng.integers(0, P, len(where))
    g = ram.gather(adds[pick] % ram.size, envs[pick], n_steps, gamma)
    horizon = g["horizon"] if g["horizon"] is not None else np.ones(len(where), np.int64)
    if batch is None:
        batch = {k: v for k, v in g.items() if v is not None}
        batch.update(truncated=np.zeros(B, bool), horizon=horizon,
                     discount=(gamma ** horizon).astype(np.float32),
                     weight=np.ones(B, np.float32))
    else:
        names = [*ram.obs_names, *("next_" + n for n in ram.obs_names),
                 *ram.spec.action_names, "reward", "terminated"]
        for name in names:
            if name in batch:
                batch[name][where] = g[name].reshape(len(where), *batch[name].shape[1:])
        if "truncated" in batch:
            batch["truncated"][where] = False
        if "horizon" in batch:
            batch["horizon"][where] = horizon
        if "discount" in batch:
            batch["discount"][where] = gamma ** horizon
        weight = batch.get("weight")
        if weight is not None:  # new steps enter at the highest priority: the least weight
            rest = np.delete(weight, where)
            weight[where] = rest.min() if len(rest) else 1.0
    batch["index"][where] = -1
    batch["step_id"][where] = -1
    return batch


class BatchPrefetcher:
    """Draws batches with ``draw(batch_size)`` under ``lock``: the one handed out by
    :meth:`get` was drawn while the caller trained on the previous one (same size), and
    the next one starts drawing as soon as it is handed out."""

    def __init__(self, draw: Callable[[int], Batch], lock: threading.Lock) -> None:
        self._draw, self._lock = draw, lock
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="expstore-sb3-prefetch")
        self._next: Future[Batch] | None = None
        self._size = 0

    def _locked(self, batch_size: int) -> Batch:
        with self._lock:
            return self._draw(batch_size)

    def get(self, batch_size: int) -> Batch:
        ahead, self._next = self._next, None
        batch = None
        if ahead is not None:
            try:
                got = ahead.result()
            except Exception:  # noqa: BLE001  (drawn again below, raising in this thread)
                got = None
            if self._size == batch_size:
                batch = got
        if batch is None:
            batch = self._locked(batch_size)
        self._size = batch_size
        self._next = self._pool.submit(self._locked, batch_size)
        return batch

    def drop(self) -> None:
        """Forget the batch drawn ahead (waiting for its draw to end): the store or the
        sampler is about to change."""
        ahead, self._next = self._next, None
        if ahead is not None:
            try:
                ahead.result()
            except Exception:  # noqa: BLE001,S110  (nobody asked for it)
                pass

    def close(self) -> None:
        self.drop()
        self._pool.shutdown(wait=True)
