"""expstore as a benchmark case with the same measuring API as ``benchmarks/baselines.py``."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

import expstore as es
from benchmarks.baselines import dir_bytes, timed_loop


def spec_for_frames(codec: dict | None = None) -> es.Spec:
    """Atari spec: one 84x84 uint8 frame per row, stacked 4 on read."""
    return es.Spec.create(obs=es.Field((84, 84), np.uint8, stack=4, codec=codec),
                          action=es.Field((), np.int64, low=0, high=17))


def extend_batches(data: dict[str, Any], chunk: int):
    """The frame stream as ``store.extend`` batches (final frames become final rows)."""
    frames = data["frames"]
    valid = np.flatnonzero(data["valid"])
    for lo in range(0, len(valid), chunk):
        idx = valid[lo : lo + chunk]
        yield dict(obs=frames[idx], action=data["actions"][idx], reward=data["rewards"][idx],
                   terminated=data["terminated"][idx], truncated=data["truncated"][idx],
                   next_obs=frames[idx + 1])


class ExpstoreCase:
    """An expstore store on local disk holding the same transitions as the baselines."""

    def __init__(self, data: dict[str, Any], capacity: int | None, tmpdir: str | Path,
                 codec: dict | None = None, shard_rows: int | None = None,
                 fsync: bool = True, name: str = "expstore") -> None:
        self.data = data
        self.name = name
        self.capacity = capacity or len(data["frames"])
        self.path = Path(tmpdir) / f"{name}.zarr"
        self.codec = codec
        self.shard_rows = shard_rows
        self.fsync = fsync
        self.store: es.Store | None = None
        self.n_transitions = int(np.sum(data["valid"]))

    def _fresh(self) -> es.Store:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)
        return es.create(self.path, spec_for_frames(self.codec), capacity=self.capacity,
                         shard_rows=self.shard_rows, fsync=self.fsync)

    def extend_rate(self, chunk: int = 1000) -> float:
        """Fill a fresh store (flush included); transitions/s."""
        store = self._fresh()
        t0 = time.perf_counter()
        for batch in extend_batches(self.data, chunk):
            store.extend(batch)
        store.flush()
        dt = time.perf_counter() - t0
        self.store = store
        return self.n_transitions / dt

    def bytes_per_transition(self) -> float:
        return dir_bytes(self.path)[0] / self.n_transitions

    def disk_bytes(self) -> dict[str, float]:
        apparent, allocated = dir_bytes(self.path)
        return {"allocated_bytes_per_transition": allocated / self.n_transitions,
                "apparent_bytes": apparent}

    def warm_cache(self) -> None:
        for p in self.path.rglob("*"):
            if p.is_file():
                p.read_bytes()
        self.reader_store = es.open(self.path)
        self.reader_store.sample(256)

    def sample_rate(self, batch_size: int, seconds: float = 0.5) -> float:
        """Uniform stacked transitions (obs + next_obs) read in this process; tr/s."""
        st = self.reader_store
        return timed_loop(lambda: st.sample(batch_size), batch_size, seconds)

    def loader_rate(self, batch_size: int, seconds: float, workers: int = 2) -> float:
        """Batches/s through ``make_loader`` into a consumer that touches the tensors."""
        loader = es.make_loader(self.reader_store, batch_size=batch_size, num_workers=workers,
                                prefetch_factor=4)
        it = iter(loader)
        for _ in range(2 * workers + 2):
            b = next(it)
        n, t0 = 0, time.perf_counter()
        while (dt := time.perf_counter() - t0) < seconds:
            b = next(it)
            float(b["obs"][0, 0, 0, 0]) + float(b["next_obs"][0, 0, 0, 0])
            n += 1
        del it
        return n / dt

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)
