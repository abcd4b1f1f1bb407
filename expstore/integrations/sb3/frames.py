"""Frame-stacked observations kept in RAM as single frames.

SB3's ``VecFrameStack`` hands a buffer whole ``(k, H, W)`` stacks whose ``k - 1`` older
frames repeat the previous step's. :class:`FrameRing` stores one frame of ``obs`` and one
of ``next_obs`` per step (``2 / (2k)`` of the bytes of whole stacks) and rebuilds stacks
when a batch is drawn. The rebuilt stacks equal the ones added, exactly: an ``add`` checks
that ``next_obs`` is ``obs`` shifted by one frame, and compares ``obs`` with the previous
step's ``next_obs`` byte for byte to know whether it continues that stream; the older
frames of a stack that does not (an episode's first, zero padded or not) are kept aside.
"""

from __future__ import annotations

import numpy as np

from ...errors import ValidationError
from ...storage.native import copy_into, same_bytes


class FrameRing:
    """Stacks of ``stack`` frames of ``shape`` for ``n_envs`` envs over a ring of ``size``
    steps. Step ``adds`` (the count of earlier adds) lives at slot ``adds % size``; its
    newest ``obs`` frame at ``adds % (size + stack - 1)`` so that the oldest step in the
    ring still finds the ``stack - 1`` frames before it."""

    def __init__(self, name: str, size: int, n_envs: int, stack: int, shape: tuple[int, ...],
                 dtype: np.dtype) -> None:
        self.name, self.size, self.n_envs, self.stack = name, int(size), int(n_envs), int(stack)
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.span = self.size + self.stack - 1
        #: one array of frames: the newest frame of each step's ``obs`` (rows ``0..span-1``,
        #: by add count % span), of its ``next_obs`` (rows ``span..span+size-1``, by slot),
        #: and a row of zeros (the padding of a stream's first stacks)
        self.pool = np.zeros((self.span + self.size + 1, self.n_envs, *self.shape), self.dtype)
        self._views()
        #: earlier steps of the same stream whose frames are in the step's ``obs`` stack
        self.back = np.zeros((self.size, self.n_envs), np.int8)
        #: (add count, env) -> older ``stack - 1`` frames of an ``obs`` that starts a stream
        #: and is not zero padded
        self.older: dict[tuple[int, int], np.ndarray] = {}
        self._want = (self.n_envs, self.stack, *self.shape)
        self._frame_bytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        #: the newest step's ``next_obs`` stacks (per env), its add count, and how many
        #: steps before it are in its stack (per env)
        self._last_next = np.zeros(self._want, self.dtype)
        self._last_add = -2
        self._run = [0] * self.n_envs

    def _views(self) -> None:
        self.frames = self.pool[:self.span]
        self.next_frames = self.pool[self.span:self.span + self.size]
        self._flat = self.pool.reshape(-1, *self.shape)
        self._zero_row = (self.span + self.size) * self.n_envs

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("frames", "next_frames", "_flat")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if isinstance(self._last_next, list):  # (pickled by 0.1.0: stacks as bytes)
            self._last_next = np.stack([
                np.zeros(self._want[1:], self.dtype) if b is None
                else np.frombuffer(b, self.dtype).reshape(self._want[1:])
                for b in self._last_next])
        self._views()

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes + self.back.nbytes

    @staticmethod
    def nbytes_for(size: int, n_envs: int, stack: int, frame_bytes: int) -> int:
        return (2 * int(size) + int(stack)) * int(n_envs) * int(frame_bytes) \
            + int(size) * int(n_envs)

    def _stacks(self, value: object, what: str) -> np.ndarray:
        want = self._want
        arr = np.asarray(value)
        if arr.shape != want:
            try:
                arr = arr.reshape(want)
            except ValueError:
                raise ValidationError(
                    f"{what}: expected frame stacks {want[1:]} ({self.dtype}) for {self.n_envs} "
                    f"env(s), got {np.shape(value)} ({arr.dtype})") from None
        if arr.dtype != self.dtype:
            arr = arr.astype(self.dtype)
        return arr

    def put(self, adds: int, obs: object, next_obs: object) -> None:
        """Store step ``adds`` (``obs``/``next_obs``: stacks, leading axis ``n_envs``)."""
        if type(obs) is not np.ndarray or obs.shape != self._want or obs.dtype != self.dtype:
            obs = self._stacks(obs, self.name)
        if type(next_obs) is not np.ndarray or next_obs.shape != self._want \
                or next_obs.dtype != self.dtype:
            next_obs = self._stacks(next_obs, "next_" + self.name)
        k, run, last_next = self.stack, self._run, self._last_next
        follows = adds == self._last_add + 1
        for e in range(self.n_envs):
            ob, nb = obs[e], next_obs[e]
            if not same_bytes(ob[1:], nb[:-1]):
                raise ValidationError(
                    f"{self.name}: frame_stack={k} expects next_obs[:, :-1] == obs[:, 1:] (a "
                    f"channel-first stack, newest frame last); env {e} gave stacks that do not "
                    "shift by one frame. A loop that passes the reset observation as the "
                    "next_obs of a terminated step (CleanRL replaces only truncated ones with "
                    "final_observation; SB3 replaces both) cannot use frame_stack: leave it "
                    "unset")
            if follows and same_bytes(ob, last_next[e]):
                run[e] = min(run[e] + 1, k - 1)
            else:
                run[e] = 0
                self._start(adds, e, obs[e, :-1])
        copy_into(last_next, next_obs)
        self._last_add = adds
        pos = adds % self.size
        self.back[pos] = run
        copy_into(self.frames[adds % self.span], obs[:, -1])
        copy_into(self.next_frames[pos], next_obs[:, -1])

    def _start(self, adds: int, env: int, older: np.ndarray) -> None:
        key = (adds, env)
        if older.any():
            self.older[key] = older.copy()
        else:
            self.older.pop(key, None)
        if len(self.older) > 2 * self.n_envs and len(self.older) % 64 == 0:
            keep_from = adds - self.size - self.stack
            self.older = {k: v for k, v in self.older.items() if k[0] >= keep_from}

    def stacks(self, adds: np.ndarray, pos: np.ndarray, envs: np.ndarray,
               obs: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
        """``(obs, next_obs)`` stacks ``(B, stack, *shape)`` of the steps with add counts
        ``adds`` at slots ``pos`` of ``envs`` (``obs=False``: ``None`` for ``obs``)."""
        k, n = self.stack, self.n_envs
        d = np.arange(k - 1, -1, -1)  # steps back, per stack position
        back = self.back[pos, envs].astype(np.int64)
        idx = ((adds[:, None] - d) % self.span) * n + envs[:, None]
        pad = back[:, None] < d  # before the stream's first step
        if pad.any():
            idx[pad] = self._zero_row
        nxt_idx = np.concatenate([idx[:, 1:], ((self.span + pos) * n + envs)[:, None]], axis=1)
        flat = self._flat
        out = flat[idx] if obs else None
        nxt = flat[nxt_idx]
        if pad.any() and self.older:  # streams whose first stack was not zero padded
            for i, j in zip(*np.nonzero(pad), strict=True):
                older = self.older.get((int(adds[i] - back[i]), int(envs[i])))
                if older is not None:
                    frame = older[j + back[i]]
                    if out is not None:
                        out[i, j] = frame
                    if j:
                        nxt[i, j - 1] = frame
        return out, nxt

    def window(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Newest frames of ``obs`` and ``next_obs`` of adds ``start..stop-1``."""
        return (ring_range(self.frames, start, stop, self.span),
                ring_range(self.next_frames, start, stop, self.size))


def ring_range(a: np.ndarray, start: int, stop: int, n: int) -> np.ndarray:
    """Rows of add counts ``start..stop-1`` of ring ``a`` of ``n`` rows: a view if they do
    not wrap, else a copy."""
    s = start % n
    if s + (stop - start) <= n:
        return a[s:s + stop - start]
    return a[np.arange(start, stop) % n]
