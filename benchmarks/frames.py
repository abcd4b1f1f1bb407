"""Realistic Atari frame streams for replay-buffer benchmarks.

Layout of the dict returned by :func:`load_atari_frames` (``n`` = frames):

* ``frames`` (n, 84, 84) uint8: single preprocessed observations; episodes are
  concatenated and each contributes its reset frame and its final frame.
* ``actions`` int64, ``rewards`` float32, ``terminated`` / ``truncated`` bool,
  all (n,): the step taken *from* frame i to frame i + 1.
* ``episode_start`` bool (n,): frame i is a reset observation.
* ``episode_id`` int64 (n,): running episode number.
* ``valid`` bool (n,): frame i starts a transition (i + 1 exists and is in the
  same episode). Non-valid frames (last frame of an episode) carry action 0,
  reward 0 and no flags. The episode cut by the end of a generated segment gets
  ``truncated=True`` on its last transition, so every episode ends with a flag.
* ``game_id`` uint8 (n,) indexes ``games`` (list of str).
* ``source``: ``"ale"`` or ``"synthetic"``; ``env_id`` / ``seed``: provenance.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
MIX_GAMES = ("Pong", "Breakout", "MsPacman")
ARRAY_KEYS = ("frames", "actions", "rewards", "terminated", "truncated",
              "episode_start", "episode_id", "valid", "game_id")
_SCALAR_KEYS = ("actions", "rewards", "terminated", "truncated", "episode_start")
_CACHE_VERSION = 1


def ale_available() -> bool:
    """True when ``ale_py`` and gymnasium import (ROMs ship with ale-py >= 0.9)."""
    try:
        import ale_py  # noqa: F401
        import gymnasium  # noqa: F401
    except ImportError:
        return False
    return True


def _empty_scalars(n: int) -> dict[str, np.ndarray]:
    return {"actions": np.zeros(n, np.int64), "rewards": np.zeros(n, np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool),
            "episode_start": np.zeros(n, bool)}


def _ale_segment(game: str, n: int, seed: int, frames_path: str, offset: int) -> dict:
    """Run a random policy for ``n`` frames, writing them into the .npy at ``offset``."""
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing

    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{game}-v5", frameskip=1)
    env = AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                             grayscale_obs=True)
    env.action_space.seed(seed)
    out = np.load(frames_path, mmap_mode="r+")
    s = _empty_scalars(n)
    obs, _ = env.reset(seed=seed)
    out[offset], s["episode_start"][0], i = obs, True, 0
    while i < n - 1:
        a = int(env.action_space.sample())
        obs, r, term, trunc, _ = env.step(a)
        s["actions"][i], s["rewards"][i] = a, r
        s["terminated"][i], s["truncated"][i] = term, trunc
        i += 1
        out[offset + i] = obs
        if (term or trunc) and i < n - 1:
            obs, _ = env.reset()
            i += 1
            out[offset + i], s["episode_start"][i] = obs, True
    out.flush()
    env.close()
    return s


def _synthetic_segment(game: str, n: int, seed: int, frames_path: str, offset: int) -> dict:
    """Pong-like frames: constant background, walls, score, moving paddles and ball.

    Drawn at 2x resolution (168x168) and 2x2-averaged so sprite edges get the
    intermediate grey levels that real resized frames have.
    """
    rng = np.random.default_rng(seed)
    out = np.load(frames_path, mmap_mode="r+")
    s = _empty_scalars(n)
    bg = np.full((168, 168), 87, np.uint8)
    bg[27:33, :] = bg[155:161, :] = 236  # walls

    def digit(f: np.ndarray, x: int, v: int, c: int) -> None:
        f[3:21, x:x + 12] = c
        f[7:17, x + 4:x + 8] = 87
        if v % 2:  # crude second glyph: an open side
            f[7:17, x:x + 4] = 87

    i = 0
    while i < n:
        drawn = int(rng.integers(600, 1100))
        length = min(drawn, n - i)
        s["episode_start"][i] = True
        py = np.array([80.0, 80.0])
        ball, vel = np.array([95.0, 84.0]), rng.choice([-3.1, 3.1], 2)
        score = [0, 0]
        for t in range(length):
            f = bg.copy()
            digit(f, 33, score[0], 181)
            digit(f, 121, score[1], 147)
            py[0] = np.clip(py[0] + rng.normal(0, 5), 35, 140)
            py[1] = np.clip(0.8 * py[1] + 0.2 * ball[0] - 7, 35, 140)
            ball += vel
            if not 35 <= ball[0] <= 150:
                vel[0] *= -1
            if not 8 <= ball[1] <= 156:
                score[int(ball[1] < 84)] += 1
                if t > 0:
                    s["rewards"][i + t - 1] = 1.0 if ball[1] > 84 else -1.0
                ball, vel = np.array([95.0, 84.0]), rng.choice([-3.1, 3.1], 2)
            y0, y1, bx, by = int(py[0]), int(py[1]), int(ball[1]), int(ball[0])
            f[y0:y0 + 15, 17:21] = 147
            f[y1:y1 + 15, 147:151] = 123
            f[by:by + 4, bx:bx + 2] = 236
            out[offset + i + t] = f.reshape(84, 2, 84, 2).mean((1, 3)).astype(np.uint8)
            if t < length - 1:
                s["actions"][i + t] = rng.integers(0, 6)
        if length > 1 and length == drawn:
            s["terminated"][i + length - 2] = True
        i += length
    out.flush()
    return s


def _run_segment(args: tuple) -> dict:
    kind, game, n, seed, path, offset = args
    fn = _ale_segment if kind == "ale" else _synthetic_segment
    s = fn(game, n, seed, path, offset)
    # the episode cut by the segment end: mark its last transition as truncated
    last_start = np.flatnonzero(s["episode_start"])[-1]
    if n - 1 > last_start and not (s["terminated"][n - 2] or s["truncated"][n - 2]):
        s["truncated"][n - 2] = True
    return s


def _plan(n: int, game: str, seed: int) -> list[tuple[str, int, int]]:
    """(game, frames, seed) per segment."""
    if game == "mix":
        sizes = [n // 3 + (k < n % 3) for k in range(3)]
        pairs = zip(MIX_GAMES, sizes, strict=True)
        return [(g, sz, seed * 1000 + k) for k, (g, sz) in enumerate(pairs)]
    parts = 2 if n >= 10_000 else 1  # fixed split: the data must not depend on `workers`
    sizes = [n // parts + (k < n % parts) for k in range(parts)]
    return [(game, sz, seed * 1000 + k) for k, sz in enumerate(sizes)]


def _cache_path(cache_dir: str | Path, kind: str, game: str, n: int, seed: int) -> Path:
    d = Path(cache_dir)
    if not d.is_absolute():
        d = REPO_ROOT / d
    return d / f"v{_CACHE_VERSION}_{kind}_{game}_n{n}_seed{seed}"


def _load(path: Path, mmap: bool = False) -> dict[str, Any]:
    mode = "r" if mmap else None
    data: dict[str, Any] = {k: np.load(path / f"{k}.npy", mmap_mode=mode) for k in ARRAY_KEYS}
    data.update(json.loads((path / "meta.json").read_text()))
    return data


def load_atari_frames(n: int, game: str = "Pong", seed: int = 0,
                      cache_dir: str | Path = "benchmarks/.cache",
                      workers: int = 2, synthetic: bool | None = None,
                      mmap: bool = False) -> dict[str, Any]:
    """Return ``n`` preprocessed 84x84 Atari frames plus per-step data (see module doc).

    Uses real ALE (``ALE/<game>-v5``, frameskip=1 + ``AtariPreprocessing``
    frame_skip=4, noop_max=30, grayscale, 84x84, default sticky actions 0.25,
    uniform random policy) when ``ale_py`` imports, else a synthetic Pong-like
    generator; ``synthetic`` forces either. ``game="mix"`` concatenates
    Pong/Breakout/MsPacman thirds. Results are cached as .npy under
    ``cache_dir`` (relative paths are taken from the repository root);
    ``mmap=True`` returns read-only memory-mapped arrays instead of loading them.
    Generation runs ``workers`` processes (~1500 frames/s each for Pong).
    """
    if synthetic is None:
        synthetic = not ale_available()
    kind = "synthetic" if synthetic else "ale"
    path = _cache_path(cache_dir, kind, game, n, seed)
    if (path / "meta.json").exists():
        return _load(path, mmap)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    frames = np.lib.format.open_memmap(tmp / "frames.npy", "w+", np.uint8, (n, 84, 84))
    del frames
    plan = _plan(n, game, seed)
    offsets = np.cumsum([0] + [sz for _, sz, _ in plan])[:-1]
    jobs = [(kind, g, sz, sd, str(tmp / "frames.npy"), int(off))
            for (g, sz, sd), off in zip(plan, offsets, strict=True)]
    if len(jobs) == 1 or workers <= 1:
        segs = [_run_segment(j) for j in jobs]
    else:
        with mp.get_context("spawn").Pool(min(workers, len(jobs))) as pool:
            segs = pool.map(_run_segment, jobs)
    games = sorted({g for g, _, _ in plan}, key=[g for g, _, _ in plan].index)
    arrays = {k: np.concatenate([s[k] for s in segs]) for k in _SCALAR_KEYS}
    arrays["episode_id"] = np.cumsum(arrays["episode_start"]).astype(np.int64) - 1
    nxt_start = np.append(arrays["episode_start"][1:], True)
    arrays["valid"] = ~nxt_start
    arrays["game_id"] = np.concatenate(
        [np.full(sz, games.index(g), np.uint8) for g, sz, _ in plan])
    for k, v in arrays.items():
        np.save(tmp / f"{k}.npy", v)
    names = games[0] if len(games) == 1 else "{" + ",".join(games) + "}"
    env_id = "synthetic-pong" if synthetic else f"ALE/{names}-v5"
    meta = {"source": kind, "games": games, "env_id": env_id, "seed": seed,
            "preprocessing": "AtariPreprocessing(frame_skip=4, noop_max=30, 84x84 gray)"}
    (tmp / "meta.json").write_text(json.dumps(meta))
    try:
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    except OSError:  # another process published the same cache entry first
        shutil.rmtree(tmp, ignore_errors=True)
    return _load(path, mmap)


def stack_indices(episode_start: np.ndarray, idx: np.ndarray, stack: int = 4) -> np.ndarray:
    """Frame indices (B, stack) for stacked obs ending at ``idx``, oldest first.

    Frames before the episode start repeat the reset frame (gymnasium
    ``FrameStackObservation`` padding_type="reset" semantics).
    """
    cols = [np.asarray(idx, np.int64)]
    for _ in range(stack - 1):
        c = cols[-1]
        cols.append(np.where(episode_start[c], c, c - 1))
    return np.stack(cols[::-1], axis=1)


def transitions(data: dict[str, Any]) -> np.ndarray:
    """Indices of frames that start a transition (``data["valid"]``)."""
    return np.flatnonzero(data["valid"])
