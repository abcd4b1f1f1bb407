"""Baseline replay buffers to compare expstore against, with a shared measuring API.

Every case takes the dict from :func:`benchmarks.frames.load_atari_frames`
(frame stack 4) and implements :class:`Case`; :func:`measure_case` turns a case
into a plain dict of medians. Rates are transitions/s unless named otherwise.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from benchmarks.frames import stack_indices, transitions


class Case(Protocol):
    """What :func:`measure_case` needs from a buffer under test."""

    name: str

    def extend_rate(self, chunk: int = 1000) -> float:
        """Fill a fresh buffer with all transitions; transitions/s."""

    def bytes_per_transition(self) -> float:
        """Storage bytes / stored transitions (after a fill)."""

    def sample_rate(self, batch_size: int, seconds: float = 0.5) -> float:
        """Uniform sampling from the filled buffer; transitions/s."""


def timed_loop(step: Callable[[], object], batch_size: int, seconds: float,
               warmup: int = 5) -> float:
    """Call ``step()`` for at least ``seconds`` after ``warmup`` calls; batch_size * calls/s."""
    for _ in range(warmup):
        step()
    count, t0 = 0, time.perf_counter()
    while (dt := time.perf_counter() - t0) < seconds:
        step()
        count += batch_size
    return count / dt


def dir_bytes(path: str | Path) -> tuple[int, int]:
    """(apparent size, allocated size) in bytes of all files under ``path``."""
    stats = [p.stat() for p in Path(path).rglob("*") if p.is_file()]
    return sum(st.st_size for st in stats), sum(st.st_blocks * 512 for st in stats)


def drop_files(files: list[str], sync: bool = False) -> None:
    """Drop ``files`` from the page cache (``posix_fadvise(DONTNEED)``); ``sync``: write
    each back first (``fsync``), else its dirty pages stay (``os.sync()`` drops them too).
    A page still on a CPU's LRU batch may stay: check with ``page_cache.resident_pages``."""
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            if sync:
                os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def drop_page_cache(path: str | Path, sync: bool = False) -> list[str]:
    """Drop every file under ``path`` from the page cache (:func:`drop_files`); the files."""
    files = [str(p) for p in Path(path).rglob("*") if p.is_file()]
    drop_files(files, sync)
    return files


def warm_page_cache(path: str | Path) -> None:
    """Read every file under ``path`` once, so that its pages are in the page cache."""
    for p in Path(path).rglob("*"):
        if p.is_file():
            p.read_bytes()


class TorchRLMemmapCase:
    """TorchRL ``ReplayBuffer`` over ``LazyMemmapStorage``, one stacked transition per row.

    Row layout (as TorchRL env/collector output is stored): ``observation``
    (4, 84, 84) uint8, ``action`` int64, ``next: {observation, reward (1,)
    float32, done / terminated / truncated (1,) bool}``. Building the
    TensorDicts is not timed; ``extend_rate`` times ``rb.extend`` only (writes
    land in the page cache; no fsync).
    """

    name = "torchrl_memmap"

    def __init__(self, data: dict[str, Any], capacity: int | None, tmpdir: str | Path,
                 stack: int = 4) -> None:
        self.data, self.stack = data, stack
        self.idx = transitions(data)
        self.capacity = capacity or len(self.idx)
        self.tmpdir, self.rb, self.scratch, self._fills = Path(tmpdir), None, None, 0

    def _chunk(self, lo: int, hi: int) -> Any:
        import torch
        from tensordict import TensorDict

        d, idx = self.data, self.idx[lo:hi]
        es, f = d["episode_start"], d["frames"]
        obs = torch.from_numpy(f[stack_indices(es, idx, self.stack)])
        nxt = torch.from_numpy(f[stack_indices(es, idx + 1, self.stack)])
        term, trunc = (torch.from_numpy(d[k][idx]).unsqueeze(-1)
                       for k in ("terminated", "truncated"))
        return TensorDict({
            "observation": obs, "action": torch.from_numpy(d["actions"][idx]),
            "next": {"observation": nxt, "done": term | trunc, "terminated": term, "truncated":
                     trunc, "reward": torch.from_numpy(d["rewards"][idx]).unsqueeze(-1)},
        }, batch_size=[len(idx)])

    def _buffer(self, batch_size: int, prefetch: int | None = None) -> Any:
        from torchrl.data import ReplayBuffer
        from torchrl.data.replay_buffers import RandomSampler

        return ReplayBuffer(storage=self.rb.storage, sampler=RandomSampler(),
                            batch_size=batch_size, prefetch=prefetch)

    def close(self) -> None:
        """Drop the buffer and delete its scratch dir."""
        self.rb = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def extend_rate(self, chunk: int = 1000) -> float:
        """Fill a fresh buffer (new scratch dir) in ``chunk``-sized extends; transitions/s."""
        from torchrl.data import LazyMemmapStorage, ReplayBuffer
        from torchrl.data.replay_buffers import RandomSampler

        self.close()
        os.sync()  # don't let the previous fill's writeback bill this one
        self._fills += 1
        self.scratch = self.tmpdir / f"torchrl_memmap_{os.getpid()}_{self._fills}"
        storage = LazyMemmapStorage(self.capacity, scratch_dir=str(self.scratch))
        self.rb = ReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=32)
        total, n = 0.0, min(len(self.idx), self.capacity)
        for lo in range(0, n, chunk):
            td = self._chunk(lo, min(lo + chunk, n))
            t0 = time.perf_counter()
            self.rb.extend(td)
            total += time.perf_counter() - t0
        return n / total

    def disk_bytes(self) -> dict[str, float]:
        """Apparent and allocated bytes per transition under the scratch dir."""
        (size, alloc), n = dir_bytes(self.scratch), len(self.rb)
        return {"bytes_per_transition": size / n, "allocated_bytes_per_transition": alloc / n}

    def bytes_per_transition(self) -> float:
        """Sum of file sizes under scratch_dir / stored transitions."""
        return self.disk_bytes()["bytes_per_transition"]

    def warm_cache(self) -> None:
        """Flush, read every storage file once, then touch the mapped tensors
        (maps the pages into this process) so sampling runs on a warm cache."""
        os.sync()
        for p in self.scratch.rglob("*"):
            if p.is_file():
                with open(p, "rb") as fh:
                    while fh.read(1 << 24):
                        pass
        tensors = getattr(self.rb.storage, "_storage", None)  # TensorDict of memmaps
        for x in tensors.values(True, True) if tensors is not None else ():
            for lo in range(0, len(x), 4096):
                x[lo:lo + 4096].max()

    def sample_rate(self, batch_size: int, seconds: float = 0.5) -> float:
        """``rb.sample()`` in a loop (batch_size fixed at construction); transitions/s."""
        rb = self._buffer(batch_size)
        return timed_loop(rb.sample, batch_size, seconds)

    def prefetch_rate(self, batch_size: int = 32, seconds: float = 0.5,
                      prefetch: int = 2) -> float:
        """Iterate ``ReplayBuffer(..., prefetch=prefetch)``; consumer reads one
        element of each obs tensor. Returns batches/s."""
        rb = self._buffer(batch_size, prefetch=prefetch)
        it = iter(rb)

        def step() -> None:
            td = next(it)
            float(td["observation"][0, 0, 0, 0])
            float(td["next", "observation"][0, 0, 0, 0])

        rate = timed_loop(step, 1, seconds)
        getattr(rb, "_prefetch_executor", None) and rb._prefetch_executor.shutdown(wait=True)
        return rate


class NumpyRing:
    """In-RAM circular buffer of single frames (cap, 84, 84) uint8 plus per-step scalars.

    Sampling builds stacked obs / next_obs with episode-start (and
    oldest-slot) clamping by fancy indexing one (B, stack + 1) gather.
    """

    def __init__(self, capacity: int, frame_shape: tuple[int, ...] = (84, 84),
                 stack: int = 4) -> None:
        self.cap, self.stack, self.ptr, self.size = capacity, stack, 0, 0
        self.frames = np.zeros((capacity, *frame_shape), np.uint8)
        self.actions = np.zeros(capacity, np.int64)
        self.rewards = np.zeros(capacity, np.float32)
        self.terminated, self.truncated, self.episode_start, self.has_next = (
            np.zeros(capacity, bool) for _ in range(4))
        self.rng = np.random.default_rng(0)

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return (self.frames, self.actions, self.rewards, self.terminated,
                self.truncated, self.episode_start, self.has_next)

    def nbytes(self) -> int:
        """Bytes held in RAM by all arrays."""
        return sum(a.nbytes for a in self._arrays())

    def extend(self, frames: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
               terminated: np.ndarray, truncated: np.ndarray,
               episode_start: np.ndarray, has_next: np.ndarray) -> None:
        """Append a stream chunk (the layout of ``load_atari_frames``)."""
        n, done = len(frames), 0
        cols = (frames, actions, rewards, terminated, truncated, episode_start, has_next)
        while done < n:
            k = min(n - done, self.cap - self.ptr)
            for d, s in zip(self._arrays(), cols, strict=True):
                d[self.ptr:self.ptr + k] = s[done:done + k]
            self.ptr, done = (self.ptr + k) % self.cap, done + k
        self.size = min(self.size + n, self.cap)

    def num_transitions(self) -> int:
        """Sampleable transitions (has a successor, which is not the unwritten slot)."""
        return int(self.has_next[:self.size].sum() - self.has_next[(self.ptr - 1) % self.cap])

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """Uniform batch: obs / next_obs (B, stack, 84, 84) uint8 views of one gather."""
        newest = (self.ptr - 1) % self.cap
        oldest = self.ptr if self.size == self.cap else 0
        idx = np.empty(0, np.int64)
        while len(idx) < batch_size:  # rejection: ~0.1% of slots are episode ends
            cand = self.rng.integers(0, self.size, batch_size + 8)
            ok = self.has_next[cand] & (cand != newest)
            idx = np.concatenate([idx, cand[ok]])
        idx = idx[:batch_size]
        cols = [(idx + 1) % self.cap, idx]
        for _ in range(self.stack - 1):
            c = cols[-1]
            cols.append(np.where(self.episode_start[c] | (c == oldest), c,
                                 (c - 1) % self.cap))
        g = self.frames[np.stack(cols[::-1], axis=1)]
        return {"obs": g[:, :-1], "next_obs": g[:, 1:], "action": self.actions[idx],
                "reward": self.rewards[idx], "terminated": self.terminated[idx],
                "truncated": self.truncated[idx]}


class NumpyRingCase:
    """:class:`NumpyRing` filled from the frame stream; capacity defaults to all frames."""

    name = "numpy_ring"

    def __init__(self, data: dict[str, Any], capacity: int | None = None,
                 stack: int = 4) -> None:
        self.data, self.stack = data, stack
        self.capacity = capacity or len(data["frames"])
        self.ring: NumpyRing | None = None

    def extend_rate(self, chunk: int = 1000) -> float:
        """Fill a fresh ring from the stream in ``chunk``-frame extends; transitions/s."""
        self.ring = None
        d, n = self.data, min(len(self.data["frames"]), self.capacity)
        ring = NumpyRing(self.capacity, d["frames"].shape[1:], self.stack)
        ring.frames[:] = 0  # fault pages in: measure copying, not first-touch
        keys = ("frames", "actions", "rewards", "terminated", "truncated",
                "episode_start", "valid")
        t0 = time.perf_counter()
        for lo in range(0, n, chunk):
            ring.extend(*(d[k][lo:lo + chunk] for k in keys))
        dt = time.perf_counter() - t0
        self.ring = ring
        return ring.num_transitions() / dt

    def bytes_per_transition(self) -> float:
        """RAM bytes of all ring arrays / stored transitions."""
        return self.ring.nbytes() / self.ring.num_transitions()

    def sample_rate(self, batch_size: int, seconds: float = 0.5) -> float:
        """``ring.sample(batch_size)`` in a loop; transitions/s."""
        return timed_loop(lambda: self.ring.sample(batch_size), batch_size, seconds)


def torchrl_memmap_case(data: dict[str, Any], capacity: int | None,
                        tmpdir: str | Path) -> TorchRLMemmapCase:
    """TorchRL LazyMemmapStorage baseline (capacity None = all transitions)."""
    return TorchRLMemmapCase(data, capacity, tmpdir)


def numpy_ring_case(data: dict[str, Any], capacity: int | None = None) -> NumpyRingCase:
    """In-RAM numpy single-frame ring baseline (capacity None = all frames)."""
    return NumpyRingCase(data, capacity)


def measure_case(case: Case, *, extend_repeats: int = 3, sample_repeats: int = 5,
                 batch_sizes: tuple[int, ...] = (32, 256), seconds: float = 0.5,
                 chunk: int = 1000) -> dict[str, Any]:
    """Run every measurement of ``case``; medians plus the raw repeats (``*_runs``).

    Keys: ``extend_tps``, ``bytes_per_transition``, ``sample_tps_bs{B}``, and
    ``prefetch_batches_per_s_bs32`` / ``allocated_bytes_per_transition`` when the
    case has ``prefetch_rate`` / ``disk_bytes``.
    """
    ext = [case.extend_rate(chunk) for _ in range(extend_repeats)]
    out: dict[str, Any] = {"case": case.name, "extend_tps": statistics.median(ext),
                           "extend_tps_runs": ext,
                           "bytes_per_transition": case.bytes_per_transition()}
    if hasattr(case, "disk_bytes"):
        out.update(case.disk_bytes())
    if hasattr(case, "warm_cache"):
        case.warm_cache()
    for bs in batch_sizes:
        runs = [case.sample_rate(bs, seconds) for _ in range(sample_repeats)]
        out[f"sample_tps_bs{bs}"], out[f"sample_tps_bs{bs}_runs"] = statistics.median(runs), runs
    if hasattr(case, "prefetch_rate"):
        runs = [case.prefetch_rate(32, seconds) for _ in range(sample_repeats)]
        out["prefetch_batches_per_s_bs32"] = statistics.median(runs)
        out["prefetch_batches_per_s_bs32_runs"] = runs
    return out
